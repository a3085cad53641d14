"""The verdict table ``audit`` and ``demo`` print: one line per job, most waste first.

Plain text, fixed-width columns; missing metrics print as ``-`` (never as 0). The first finding
of each job (the verdict's reason) is shortened into a ``WHY`` column so the table alone tells an
admin what to look at; ``explain`` shows the rest.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from auditor.core.job_summary import JobSummary

_COLUMNS = (
    ("NAMESPACE", "namespace", "<"),
    ("JOB", "job", "<"),
    ("TEAM", "team", "<"),
    ("GPUS", "gpus", ">"),
    ("GPU-H", "gpu_hours", ">"),
    ("UTIL", "gpu_util", ">"),
    ("SM", "sm_active", ">"),
    ("TENSOR", "tensor_active", ">"),
    ("DRAM", "dram_active", ">"),
    ("MFU~", "mfu_estimate", ">"),
    ("COV", "coverage", ">"),
    ("WASTE-H", "waste_gpu_hours", ">"),
    ("VERDICT", "verdict", "<"),
)
_PERCENT = {"gpu_util", "sm_active", "tensor_active", "dram_active", "mfu_estimate", "coverage"}
_NOTES = {
    "collective_wait_straggler": "straggler",
    "idle_gpus_in_job": "idle GPUs",
    "gpu_imbalance": "imbalanced",
    "gpu_shared": "shared GPU",
    "profiling_zero_suspect": "suspect zeros",
    "fp32_pipe_missing": "no FP32 series",
    "garbage_dropped": "garbage dropped",
    "copy_only": "copies only",
}


def _cell(summary: JobSummary, key: str) -> str:
    v = summary.value_of(key)
    if key == "gpu_util" and v is None and summary.means.gr_engine_active is not None:
        return f"{summary.means.gr_engine_active * 100:.0f}%*"  # MIG: the busy signal is GR_ENGINE_ACTIVE
    if v is None or v == "":
        return "-"
    if key in _PERCENT:
        pct = float(str(v)) * 100
        return f"{pct:.1f}%" if 0 < pct < 10 else f"{pct:.0f}%"
    if key == "gpus":
        g = float(str(v))
        return f"{g:g}" if g == int(g) else f"{g:.2f}"
    if key in ("gpu_hours", "waste_gpu_hours"):
        return f"{float(str(v)):.2f}"
    return str(v)


def notes(codes: Iterable[str]) -> str:
    """Short tags for the notable non-verdict findings (straggler, idle GPUs, ...), from the
    findings' codes."""
    return ", ".join(_NOTES[c] for c in codes if c in _NOTES)


def format_table(summaries: Sequence[JobSummary]) -> str:
    """The verdict table as text (ends with a newline); an empty list gives a one-line note."""
    if not summaries:
        return "no GPU jobs found in the window\n"
    header = [c[0] for c in _COLUMNS] + ["NOTES"]
    rows = [[_cell(s, key) for _, key, _ in _COLUMNS] + [notes(f.code for f in s.findings)] for s in summaries]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    aligns = [c[2] for c in _COLUMNS] + ["<"]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(f"{c:{a}{w}}" for c, a, w in zip(cells, aligns, widths)).rstrip()

    out = [line(header)] + [line(r) for r in rows]
    total_h = sum(s.gpu_hours or 0.0 for s in summaries)
    wastes = [s.waste_gpu_hours for s in summaries if s.waste_gpu_hours is not None]
    footer = f"{len(summaries)} jobs, {total_h:.2f} GPU-hours"
    if wastes:
        footer += f", {sum(wastes):.2f} GPU-hours without SM activity (jobs with SM data)"
    if any(s.means.gpu_util is None and s.means.gr_engine_active is not None for s in summaries):
        footer += "; * = MIG, utilization from GR_ENGINE_ACTIVE"
    if any(s.mfu_estimate is not None for s in summaries):
        footer += "; MFU~ = share of the dense tensor peak of the precision in use (bf16, FP8 or TF32)"
    out.append(footer)
    return "\n".join(out) + "\n"
