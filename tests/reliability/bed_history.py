"""Ten GPU pods of synthetic dcgm-exporter history in the bed's Prometheus, for issue 35's probes
of what an answer may do to a read (bounds, malformed answers, duplicates).

Each module backfills its own ``case`` (a unique label value) once and audits it through
``--match case=…``, so it never sees another test's series.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from auditor.cli.main import main

NAMES = {"DCGM_FI_DEV_GPU_UTIL": 90.0, "DCGM_FI_PROF_SM_ACTIVE": 0.5, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.2}
GPUS = 10
STEP = 15


@dataclass(frozen=True)
class History:
    case: str
    #: a 30-minute window of whole 5-minute buckets (read as four aggregates per name)
    start: int
    end: int

    def window(self, raw: bool = False) -> list[str]:
        """``--start``/``--end`` of the window, or of its last 5 minutes (read raw, one query a name)."""
        start = self.end - 300 if raw else self.start
        return ["--start", _rfc(start), "--end", _rfc(self.end)]

    @property
    def match(self) -> list[str]:
        return ["--match", f"case={self.case}"]


def _rfc(ts: int) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def backfill_ten_gpus(prometheus: object) -> History:
    """Write the history (30 minutes either side of the window too) and return where it is."""
    case = f"rb-{uuid.uuid4().hex[:10]}"
    end = int(time.time()) // 300 * 300 - 3600
    start = end - 1800
    lines: list[str] = []
    for name, value in NAMES.items():
        lines.append(f"# TYPE {name} gauge")
        for i in range(GPUS):
            labels = (
                f'Hostname="node-{i // 8}",UUID="GPU-{case}-{i}",case="{case}",container="main",'
                f'device="nvidia{i % 8}",gpu="{i % 8}",modelName="NVIDIA H200",namespace="ml",pod="train-{i}"'
            )
            lines.extend(f"{name}{{{labels}}} {value} {t}" for t in range(start - 1800, end + 1800, STEP))
    prometheus.backfill("\n".join(lines) + "\n")  # type: ignore[attr-defined]
    return History(case, start, end)


def audit(capsys: pytest.CaptureFixture[str], url: str, db: Path, *args: str) -> tuple[int, str, str]:
    """``gpu-auditor audit --no-kube -o json`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    rc = main(["audit", "--prometheus", url, "--no-kube", "--db", f"sqlite:///{db}", "-o", "json", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def jobs_of(out: str) -> list[dict]:
    """The audit JSON's jobs without ``computed_at`` (when each audit ran)."""
    jobs = json.loads(out)
    for job in jobs:
        job.pop("computed_at", None)
    return jobs


def summaries(db: Path) -> int:
    """Job summaries stored (0 when the store holds none, or was never made)."""
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        try:
            return int(conn.execute("select count(*) from job_summaries").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def error_line(err: str) -> str:
    """The one line the CLI ends a failure with (``gpu-auditor: failed…``), checked to be one line."""
    lines = [line for line in err.strip().splitlines() if line.startswith("gpu-auditor: failed")]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]


def settings_file(tmp_path: Path, **prometheus: object) -> list[str]:
    """``--config FILE`` of a settings file with these ``prometheus:`` keys."""
    path = tmp_path / "settings.yaml"
    path.write_text("prometheus:\n" + "".join(f"  {k}: {v}\n" for k, v in prometheus.items()))
    return ["--config", str(path)]
