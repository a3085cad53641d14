"""A private bed dies with its owner (auditor/testbed/watchdog.py): killing the process that
started it (as a CI timeout kills pytest) stops every server the bed recorded."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from auditor.testbed import process, watchdog
from auditor.testbed.state import Proc, State


def _server(state: State, name: str) -> Proc:
    """A stand-in server, recorded in the state file as the bed records its servers."""
    marker = f"watchdog-test-{uuid.uuid4().hex}"
    argv = [sys.executable, "-c", "import time, sys; time.sleep(300)", marker]
    pid = process.start(name, argv, state.dir / "logs" / f"{name}.log")
    proc = Proc(name=name, pid=pid, argv=argv, log=str(state.dir / "logs" / f"{name}.log"), marker=marker)
    state.record(proc)
    return proc


def _gone_within(proc: Proc, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not process.alive(proc.pid, proc.marker):
            return True
        time.sleep(0.1)
    return False


def test_a_killed_owner_takes_its_bed_down(tmp_path: Path) -> None:
    state = State(tmp_path / "bed")
    servers = [_server(state, "etcd"), _server(state, "prometheus")]
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        dog = watchdog.spawn(state.dir, owner.pid)
        time.sleep(1.5)  # the watchdog has polled the living owner and left the bed alone
        assert all(process.alive(s.pid, s.marker) for s in servers)
        owner.kill()  # SIGKILL: no handler of the owner's runs
        owner.wait()
        assert all(_gone_within(s, 20) for s in servers), "the bed outlived its owner"
        assert _gone_within(Proc("watchdog", dog, [], "", marker="auditor.testbed.watchdog"), 20)
        assert State.load(state.dir).procs == {}
    finally:
        owner.kill()
        for s in servers:
            process.stop(s.pid, s.marker, timeout=5)


def test_the_owner_is_known_by_pid_and_start_time() -> None:
    """A pid reused by another process after the owner died is not the owner."""
    process_pid = os.getpid()
    me = watchdog.start_time(process_pid)
    assert me and watchdog.owner_alive(process_pid, me)
    assert not watchdog.owner_alive(process_pid, str(int(me) + 1))
    assert watchdog.start_time(2**22 + 7) == ""  # beyond pid_max: no such process
