"""A real PostgreSQL (the Debian package) with its own cluster directory, on loopback TCP.

PostgreSQL refuses to run as root, and CI and these machines are root: initdb and postgres then
run as the ``postgres`` user, in a directory that user owns and can reach (a pytest temporary
directory under a 0700 root-owned parent is not reachable, so then a directory under /tmp is used).
Durability is off (fsync, full-page writes): this cluster is thrown away.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import psycopg

from auditor.testbed.binaries import Binaries
from auditor.testbed.errors import TestbedError
from auditor.testbed.launch import launch, log_path
from auditor.testbed.state import State

SERVICE_USER = "postgres"
DATABASE = "testbed"


def _run_as() -> str | None:
    """The user to run the server as: ``postgres`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError as exc:
        raise TestbedError(
            "postgresql", f"running as root and there is no '{SERVICE_USER}' user to run the server as"
        ) from exc
    return SERVICE_USER


def _reachable_by_others(path: Path) -> bool:
    """Whether every ancestor of ``path`` lets other users through (o+x)."""
    for parent in [path, *path.parents]:
        try:
            if not os.stat(parent).st_mode & 0o001:
                return False
        except FileNotFoundError:
            continue
    return True


def _cluster_dir(state: State, user: str | None) -> Path:
    preferred = state.dir / "postgres"
    if user is None or _reachable_by_others(state.dir):
        preferred.mkdir(parents=True, exist_ok=True)
        return preferred
    tmp = Path(tempfile.mkdtemp(prefix="gpu-auditor-pg-"))
    os.chmod(tmp, 0o755)
    return tmp


def url(password: str, port: int, database: str = DATABASE) -> str:
    return f"postgresql://{SERVICE_USER}:{password}@127.0.0.1:{port}/{database}"


def start(state: State, bins: Binaries) -> str:
    user = _run_as()
    base = _cluster_dir(state, user)
    state.set(postgres_dir=str(base))
    data = base / "data"
    log = log_path(state, "postgresql")
    log.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_hex(12)
    pwfile = base / "pwfile"
    pwfile.write_text(password + "\n")
    if user:
        entry = pwd.getpwnam(user)
        for p in (base, pwfile):
            os.chown(p, entry.pw_uid, entry.pw_gid)
    pwfile.chmod(0o600)
    if data.exists():
        shutil.rmtree(data)

    with open(log, "ab") as out:
        rc = subprocess.run(
            [
                str(bins.pg_bin / "initdb"),
                "-D",
                str(data),
                "-U",
                SERVICE_USER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                f"--pwfile={pwfile}",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
                "--no-instructions",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            user=user,
            group=user,
            cwd=str(base),
        ).returncode
    pwfile.unlink()
    if rc != 0:
        raise TestbedError("postgresql", f"initdb exited with code {rc}", log)

    def argv(p: dict[str, int]) -> Sequence[str]:
        return [
            str(bins.pg_bin / "postgres"),
            "-D",
            str(data),
            "-p",
            str(p["port"]),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "unix_socket_directories=",
            "-c",
            "fsync=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "shared_buffers=32MB",
            "-c",
            "max_connections=100",
        ]

    def ready(p: dict[str, int]) -> Callable[[], bool]:
        def probe() -> bool:
            with psycopg.connect(url(password, p["port"], "postgres"), connect_timeout=3) as conn:
                conn.execute("SELECT 1")
            return True

        return probe

    # SIGINT is PostgreSQL's "fast shutdown"; SIGTERM would wait for every client to disconnect.
    proc, secs = launch(
        state,
        "postgresql",
        argv,
        ready,
        ports=("port",),
        marker=str(data),
        timeout=60,
        stop_signal=signal.SIGINT,
        user=user,
    )
    port = proc.ports["port"]
    with psycopg.connect(url(password, port, "postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    database_url = url(password, port)
    state.set(database_url=database_url, postgres_admin_url=url(password, port, "postgres"))
    print(
        f"testbed: postgresql ready at 127.0.0.1:{port}, database {DATABASE!r} ({secs:.1f} s)",
        file=sys.stderr,
        flush=True,
    )
    return database_url


def healthy(state: State) -> bool:
    admin = state.values.get("postgres_admin_url")
    if not admin:
        return False
    try:
        with psycopg.connect(admin, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def remove_dir(state: State) -> None:
    """Delete the cluster directory if it lives outside the state directory (the /tmp case)."""
    d = state.values.get("postgres_dir")
    if d and not Path(d).is_relative_to(state.dir) and Path(d).name.startswith("gpu-auditor-pg-"):
        shutil.rmtree(d, ignore_errors=True)
