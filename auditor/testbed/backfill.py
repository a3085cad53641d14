"""Backfill OpenMetrics history into Prometheus with ``promtool tsdb create-blocks-from openmetrics``.

Prometheus 2.42 loads new blocks from its data directory only at start-up or on its periodic
block reload (about once a minute). Waiting a minute per test is too slow, so the test bed's
Prometheus is restarted after a backfill: the write-ahead log replays and it is ready again in
about a second (measured figures in docs/testbed.md). A file lock serialises backfills, so two
sessions sharing one test bed never restart it at the same time.

``write_blocks`` is the part usable against any Prometheus data directory (e.g. from the CLI):
it only creates the blocks; that Prometheus then sees them on its next reload or restart.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from auditor.errors import BadInput
from auditor.testbed import process, prometheus
from auditor.testbed.errors import TestbedError
from auditor.testbed.launch import launch
from auditor.testbed.state import State

EOF_MARKER = "# EOF"


def normalise(openmetrics_text: str) -> str:
    """The text with exactly one trailing ``# EOF`` line, which OpenMetrics (and promtool) require."""
    body = openmetrics_text.rstrip()
    if not body:
        raise BadInput("backfill: the OpenMetrics text is empty")
    if not body.endswith(EOF_MARKER):
        body += "\n" + EOF_MARKER
    return body + "\n"


def write_blocks(
    openmetrics_text: str, data_dir: Path, promtool: str = "promtool", *, max_block_duration: str | None = None
) -> list[Path]:
    """Turn OpenMetrics text into TSDB blocks and move them into ``data_dir``; return the blocks.

    promtool writes into a scratch directory on the same file system first, and each finished
    block is renamed into place, so a running Prometheus never sees a half-written block.
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".backfill-", dir=data_dir.parent))
    try:
        source = scratch / "input.om"
        source.write_text(normalise(openmetrics_text))
        out = scratch / "blocks"
        out.mkdir()
        cmd = [promtool, "tsdb", "create-blocks-from", "openmetrics"]
        if max_block_duration:
            cmd.append(f"--max-block-duration={max_block_duration}")
        cmd += [str(source), str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip()
            raise BadInput(f"backfill: promtool refused the OpenMetrics text: {detail}")
        moved = []
        for block in sorted(p for p in out.iterdir() if p.is_dir()):
            target = data_dir / block.name
            os.replace(block, target)
            moved.append(target)
        return moved
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def restart_prometheus(state: State) -> float:
    """Restart the test bed's Prometheus on the same port; returns seconds until it was ready."""
    proc = state.procs.get("prometheus")
    if proc is None:
        raise TestbedError("prometheus", f"no Prometheus recorded in {state.file}")
    process.stop(proc.pid, proc.marker, proc.stop_signal)
    port = proc.ports["web"]
    _, secs = launch(
        state,
        "prometheus",
        lambda p: proc.argv,
        lambda p: prometheus.ready_probe(port),
        fixed_ports={"web": port},
        marker=proc.marker,
        timeout=60,
    )
    return secs


def backfill(state_dir: Path, openmetrics_text: str) -> list[Path]:
    """Backfill into the test bed in ``state_dir``; the data is queryable when this returns."""
    state = State.load(Path(state_dir))
    if state is None or "prometheus_data_dir" not in state.values:
        raise TestbedError("prometheus", f"no running test bed in {state_dir}")
    lock_path = Path(state.values["prometheus_data_dir"]).parent / "backfill.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # re-read under the lock: another session may have restarted Prometheus (new pid)
        state = State.load(Path(state_dir)) or state
        blocks = write_blocks(
            openmetrics_text, Path(state.values["prometheus_data_dir"]), state.values.get("promtool", "promtool")
        )
        if blocks:
            restart_prometheus(state)
        return blocks
