"""Servers under test as their own processes on loopback: started with a clean environment,
polled until /healthz answers, their CPU time read from /proc, stopped with SIGTERM."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bench.harness.serving import free_port

ROOT = Path(__file__).resolve().parents[2]
# The fake upstream and the bare relay, each run as its own process (add "--port", ...).
UPSTREAM_CMD = (sys.executable, "-m", "bench.harness.upstream")
NAIVE_CMD = (sys.executable, "-m", "bench.harness.naive")


@dataclass
class Proc:
    """A server process under test, and its CPU time read from /proc."""

    name: str
    popen: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/responses"

    def cpu_s(self) -> float:
        """On-CPU time of all its threads, from schedstat (ns); /proc/PID/stat ticks if absent."""
        pid = self.popen.pid
        try:
            total = 0
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            return total / 1e9
        except (FileNotFoundError, ProcessLookupError):
            with open(f"/proc/{pid}/stat") as f:
                # Fields after the command name; utime and stime are the 14th and 15th.
                rest = f.read().rsplit(")", 1)[1].split()
            return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def server_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment without the caller's CTXPROXY_* settings; bench/ importable from anywhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def start(name: str, cmd: list[str], env: dict[str, str], port: int, workdir: Path) -> Proc:
    log = workdir / f"{name}.log"
    out: IO[bytes] = log.open("wb")
    # Started in the work directory: `python -m` puts its cwd first on sys.path, ahead of
    # PYTHONPATH, so a build under test (overhead_ab's --base) would lose to the caller's tree.
    popen = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    out.close()
    proc = Proc(name, popen, port, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"{name} exited at start-up:\n{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200:
                    return proc
        time.sleep(0.05)  # start-up polling only; nothing is measured here
    stop(proc)
    raise RuntimeError(f"{name} did not come up on port {port}")


def stop(proc: Proc) -> None:
    if proc.popen.poll() is None:
        proc.popen.send_signal(signal.SIGTERM)
        try:
            proc.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait()


def proxy_cmd(profile: Path | None = None) -> list[str]:
    prefix = [sys.executable]
    if profile is not None:
        prefix += ["-m", "cProfile", "-o", str(profile.resolve())]  # the server runs elsewhere
    return [*prefix, "-m", "ctxproxy.proxy", "serve"]


def start_proxy(name: str, upstream: Proc, workdir: Path, keep_turns: int | None = None,
                profile: Path | None = None, defaults: bool = False) -> Proc:
    """ctxproxy with its defaults (``defaults``: memory on, a team for knowledge discovery),
    or with memory off and ``keep_turns``."""
    port = free_port()
    settings = {
        "CTXPROXY_PORT": str(port),
        "CTXPROXY_UPSTREAM_URL": f"http://127.0.0.1:{upstream.port}/v1",
        "CTXPROXY_DATA_DIR": str(workdir / f"{name}-data"),
    }
    if defaults:
        settings["CTXPROXY_TEAM_ID"] = "bench-team"
    else:
        settings["CTXPROXY_MEMORY_ENABLED"] = "false"
        settings["CTXPROXY_KEEP_TURNS"] = str(keep_turns)
    env = server_env(settings)
    return start(name, proxy_cmd(profile), env, port, workdir)


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a supervisor and its workers)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children[int(f.read().rsplit(")", 1)[1].split()[1])].append(int(entry))
            except OSError:
                continue  # gone meanwhile
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def tree_cpu_s(root: int) -> dict[int, float]:
    """On-CPU seconds of every thread of ``root`` and its descendants now (children that
    start later, as the workers' ledger processes do, are found at each call), by process,
    from schedstat."""
    seconds: dict[int, float] = {}
    for pid in tree(root):
        with contextlib.suppress(OSError):
            total = 0
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            seconds[pid] = total / 1e9
    return seconds


def cpu_since(root: int, before: dict[int, float]) -> float:
    """On-CPU seconds of ``root``'s tree since ``before`` (``tree_cpu_s``): a process
    started since counts from its start (one that ended meanwhile is missed)."""
    return sum(s - before.get(pid, 0.0) for pid, s in tree_cpu_s(root).items())


def vm_kib(pid: int, field_name: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0
