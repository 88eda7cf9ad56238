"""A private PostgreSQL server for one test, which the test may stop and start at will.

The shared server (``CTXPROXY_TEST_PG_URL``) serves every other test, so a test that takes
the database away must have its own: ``initdb`` into a temporary folder, trust auth on
loopback only, a free port. PostgreSQL refuses to run as root, so when the tests run as root
(containers, CI) every server command runs as the ``postgres`` OS user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.fakes.server import free_port

__all__ = ["PrivatePostgres", "cannot_run_reason", "find_bindir"]

OS_USER = "postgres"


def find_bindir() -> Path | None:
    """The newest installed server's ``bin`` folder (Debian layout), or None."""
    root = Path("/usr/lib/postgresql")
    versions = sorted(
        (p for p in root.glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    return versions[-1] if versions else None


def cannot_run_reason() -> str | None:
    """Why a private server cannot be started here, or None when it can."""
    if os.geteuid() != 0:
        return "a private PostgreSQL needs root (to run initdb and pg_ctl as `postgres`)"
    if find_bindir() is None:
        return "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
    if shutil.which("runuser") is None:
        return "runuser is not installed"
    try:
        import pwd

        pwd.getpwnam(OS_USER)
    except KeyError:
        return f"there is no `{OS_USER}` OS user"
    return None


@dataclass
class PrivatePostgres:
    """One throw-away cluster: ``start()``, ``stop()``, ``start()`` again, ``destroy()``."""

    bindir: Path
    root: Path
    port: int

    @classmethod
    def create(cls) -> PrivatePostgres:
        bindir = find_bindir()
        assert bindir is not None, cannot_run_reason()
        # Not under pytest's tmp_path: its folders are root-only and the server runs as
        # `postgres`. A short path also keeps the socket path under the 107-byte limit.
        root = Path(tempfile.mkdtemp(prefix="ctxpg-"))
        shutil.chown(root, OS_USER)
        server = cls(bindir, root, free_port())
        server._run("initdb", "-D", str(server.data), "-U", "postgres", "--auth=trust",
                    "-E", "UTF8", "--no-sync")
        return server

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c synchronous_commit=off")
        self._run("pg_ctl", "-D", str(self.data), "-o", options,
                  "-l", str(self.root / "server.log"), "-w", "-t", "30", "start")

    def stop(self) -> None:
        """Stop at once (``-m fast``: open connections are cut, as in a crash or failover)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop")

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        argv = ["runuser", "-u", OS_USER, "--", str(self.bindir / program), *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip()}")
