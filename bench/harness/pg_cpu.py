"""The CPU PostgreSQL spends serving the proxies of a load run: its backends whose client is a
socket of a proxy's process (found by the socket's port), read from /proc. Other clients of
the same server (other jobs' tests) are left out; its shared processes (WAL writer,
checkpointer, autovacuum) are not counted."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

__all__ = ["backend_cpu", "since"]

_TICK = os.sysconf("SC_CLK_TCK")


def _socket_inodes(pids: Iterable[int]) -> set[str]:
    found: set[str] = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:  # gone
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:  # closed since (the listing's own, for one)
                continue
            if link.startswith("socket:["):
                found.add(link[8:-1])
    return found


def _client_ports(inodes: set[str], server_port: int) -> set[int]:
    """The local ports of the TCP sockets ``inodes`` connected to ``server_port``."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                local, remote, inode = fields[1], fields[2], fields[9]
                if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == server_port:
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def _cpu_s(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def backend_cpu(url: str, client_pids: Iterable[int]) -> dict[int, float]:
    """CPU seconds so far of each backend serving a socket of ``client_pids``."""
    ports = _client_ports(_socket_inodes(client_pids), urlsplit(url).port or 5432)
    with psycopg.connect(url, autocommit=True) as conn:
        pids = [pid for pid, port in conn.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE client_port IS NOT NULL")
            if port in ports]
    return {pid: cpu for pid in pids if (cpu := _cpu_s(pid)) is not None}


def since(before: dict[int, float], now: dict[int, float]) -> float:
    """CPU seconds spent between two readings (a backend opened since counts whole)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in now.items())
