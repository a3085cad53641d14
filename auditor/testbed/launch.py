"""Start one server, wait until it answers, record it; retry with new ports on a bind race."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from auditor.testbed import process
from auditor.testbed.errors import TestbedError
from auditor.testbed.state import Proc, State

BIND_ERRORS = ("address already in use", "could not bind", "bind: address")


def launch(
    state: State,
    name: str,
    argv_for: Callable[[dict[str, int]], Sequence[str]],
    ready_for: Callable[[dict[str, int]], Callable[[], bool]],
    *,
    ports: Sequence[str] = (),
    fixed_ports: Mapping[str, int] | None = None,
    marker: str,
    timeout: float,
    stop_signal: int = signal.SIGTERM,
    user: str | None = None,
    env: Mapping[str, str] | None = None,
    attempts: int = 3,
) -> tuple[Proc, float]:
    """Start ``name``; returns its record and the seconds it took to become ready."""
    log = state.dir / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, attempts + 1):
        chosen = dict(fixed_ports or {})
        for p in ports:
            chosen.setdefault(p, process.free_port())
        argv = list(argv_for(chosen))
        offset = log.stat().st_size if log.exists() else 0
        t0 = time.monotonic()
        pid = process.start(name, argv, log, user=user, env=env)
        proc = Proc(
            name=name,
            pid=pid,
            argv=argv,
            log=str(log),
            marker=marker,
            stop_signal=int(stop_signal),
            user=user,
            ports=chosen,
        )
        state.record(proc)
        try:
            process.wait_ready(name, pid, ready_for(chosen), log, timeout)
        except TestbedError:
            process.stop(pid, marker, stop_signal, timeout=10)
            with open(log, "rb") as fh:
                fh.seek(offset)
                fresh = fh.read().decode(errors="replace").lower()
            if attempt < attempts and not fixed_ports and any(e in fresh for e in BIND_ERRORS):
                continue
            raise
        return proc, time.monotonic() - t0
    raise AssertionError("unreachable")


def log_path(state: State, name: str) -> Path:
    return state.dir / "logs" / f"{name}.log"
