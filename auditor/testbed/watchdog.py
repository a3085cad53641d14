"""A private test bed that dies with its owner.

The servers of a bed run in their own sessions so that they outlive the ``up`` command (the
shared bed must). A bed that pytest starts for one session should not: when that pytest is
killed (a CI timeout, a Ctrl-C twice, SIGKILL) its fixture's ``down`` never runs and the whole
bed (apiserver, etcd, Prometheus, PostgreSQL, Kueue, a kubelet) is left running. So ``up`` with
an owner starts this watchdog: a small process in a session of its own that polls the owner's pid
(with its start time, since pids are reused) and runs ``down`` on the state directory once the
owner is gone. A normal ``down`` by the owner leaves the watchdog nothing to do; it exits after
the owner does.

``PR_SET_PDEATHSIG`` was not used: it fires when the *thread* that forked a child exits, and
``up`` starts the servers from worker threads that end as soon as ``up`` returns.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from auditor.testbed import process


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of ``/proc/PID/stat``); "" if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def owner_alive(pid: int, started: str) -> bool:
    return process.alive(pid) and start_time(pid) == started


def spawn(state_dir: Path, owner_pid: int) -> int:
    """Start the watchdog of ``state_dir`` for ``owner_pid``; returns the watchdog's pid."""
    argv = [
        sys.executable,
        "-m",
        "auditor.testbed.watchdog",
        f"--owner={owner_pid}",
        f"--owner-start={start_time(owner_pid)}",
        f"--dir={state_dir}",
    ]
    return process.start("watchdog", argv, state_dir / "logs" / "watchdog.log")


def watch(state_dir: Path, owner_pid: int, owner_start: str, poll: float = 1.0) -> int:
    while owner_alive(owner_pid, owner_start):
        time.sleep(poll)
    from auditor.testbed import bed

    stopped = bed.down(state_dir, quiet=True)
    if stopped:
        print(f"testbed watchdog: owner {owner_pid} gone, stopped {stopped} processes of {state_dir}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m auditor.testbed.watchdog")
    p.add_argument("--owner", type=int, required=True)
    p.add_argument("--owner-start", required=True)
    p.add_argument("--dir", type=Path, required=True)
    args = p.parse_args(argv)
    return watch(args.dir, args.owner, args.owner_start)


if __name__ == "__main__":
    sys.exit(main())
