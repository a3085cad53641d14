"""Starting, watching and stopping the test bed's server processes.

Each server runs in its own session (so its process group is its pid) with its output in a log
file, and outlives the ``up`` command that started it. Stopping signals only the process groups
whose pids the test bed recorded, after checking that the pid still runs the expected program
(pids are reused), and never matches processes by name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from auditor.testbed.errors import TestbedError

if TYPE_CHECKING:
    import requests

#: Popen objects of the children this Python process started, so stopping them also reaps them.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry on a bind race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    component: str,
    argv: Sequence[str],
    log: Path,
    *,
    user: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> int:
    """Start ``argv`` in a new session with stdout/stderr appended to ``log``; return its pid.

    A server outlives the test that (re)started it and serves every later test, so it never
    inherits a clock shifted for one test run (libfaketime's ``LD_PRELOAD`` and ``FAKETIME*``,
    as tests/clock/run-shifted.sh sets them): the bed's servers keep real time.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in (os.environ if env is None else env).items() if not _shifts_clock(k, v)}
    with open(log, "ab") as out:
        out.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=str(cwd) if cwd else None,
                user=user,
                group=user,
            )
        except OSError as exc:
            raise TestbedError(component, f"cannot execute {argv[0]}: {exc}", log) from exc
    _CHILDREN[proc.pid] = proc
    return proc.pid


def _shifts_clock(name: str, value: str) -> bool:
    return name.startswith("FAKETIME") or (name == "LD_PRELOAD" and "faketime" in value)


def alive(pid: int, marker: str | None = None) -> bool:
    """Whether ``pid`` runs and is not a zombie; with ``marker``, its command line must contain it."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    if state in ("Z", "X"):
        return False
    return marker is None or marker in cmdline


def exit_code(pid: int) -> int | None:
    child = _CHILDREN.get(pid)
    return child.poll() if child is not None else None


def wait_ready(
    component: str,
    pid: int,
    check: Callable[[], bool],
    log: Path,
    timeout: float,
    interval: float = 0.2,
) -> float:
    """Poll ``check`` until it is true; fail fast if the process dies. Returns seconds waited."""
    t0 = time.monotonic()
    last_exc: Exception | None = None
    while True:
        try:
            if check():
                return time.monotonic() - t0
        except Exception as exc:  # noqa: BLE001 - any failure of the probe means "not ready yet"
            last_exc = exc
        if not alive(pid):
            rc = exit_code(pid)
            raise TestbedError(component, f"process exited during start-up (exit code {rc})", log)
        if time.monotonic() - t0 > timeout:
            cause = f"not ready after {timeout:.0f} s"
            if last_exc is not None:
                cause += f" (last probe error: {last_exc})"
            raise TestbedError(component, cause, log)
        time.sleep(interval)


def stop(pid: int, marker: str | None, sig: int = signal.SIGTERM, timeout: float = 30.0) -> bool:
    """Stop the process group led by ``pid`` (sig, then SIGKILL after ``timeout``). True if it ran."""
    if not alive(pid, marker):
        _reap(pid)
        return False
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        _reap(pid)
        return False
    except PermissionError:
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while alive(pid) and time.monotonic() < deadline + 10:
            time.sleep(0.1)
    _kill_group_leftovers(pid)
    _reap(pid)
    return True


def _kill_group_leftovers(pgid: int) -> None:
    """SIGKILL any process still in the group (e.g. PostgreSQL's backends after its postmaster)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) == pgid and alive(int(entry.name)):
                os.kill(int(entry.name), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            continue


def _reap(pid: int) -> None:
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (PostgreSQL forks one process per backend)."""
    total = 0
    pids = {pid} | _descendants(pid)
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[-1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        for child, parent in parents.items():
            if parent == p and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def local_get(url: str, **kwargs: object) -> requests.Response:
    """GET on loopback, ignoring proxy and CA-bundle settings from the environment."""
    import requests

    with requests.Session() as s:
        s.trust_env = False
        return s.get(url, **kwargs)  # type: ignore[arg-type]
