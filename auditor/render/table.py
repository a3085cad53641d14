"""The verdict table ``audit``, ``run --once`` and ``demo`` print: one line per job, most GPU-hours lost
(the larger of WASTE-H and GAP-H) first.

Plain text, fixed-width columns; missing metrics print as ``-`` (never as 0). The notable
findings of each job are shortened into a ``NOTES`` column so the table alone tells an admin
what to look at; ``explain`` shows the rest.

Two layouts, as kubectl has: the default fits :data:`WIDTH` (120) columns, so it reads in a
120-column terminal without wrapping: the columns that decide what to look at (GPUs, hours,
utilization against SM activity, the MFU estimate, waste and the MFU gap, verdict), with the
namespace, job and notes cut with an ellipsis (a job name in its middle) when they would not
fit. ``wide`` adds team, tensor and DRAM activity, the reference MFU and its class, coverage and
cuts nothing. Text from the cluster (names, teams) passes through :func:`terminal_safe`.

The MFU estimate is relative to the dense tensor peak of the precision in use (of a MIG slice:
the slice's share of it); where the tensor cores do no work (verdict ``no_tensor_cores``) it
means nothing and reads ``n/a``. ``GAP-H`` is the GPU-hours the job would not have needed at the
reference MFU of its workload class (or of its lineage's best run): ``recoverable_gpu_hours``.
TENSOR left the default layout for MFU~: the estimate is the tensor activity scaled by the
clock, and the table had room for one of them beside the gap.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from auditor.core.figures import gpus_text, of_jobs
from auditor.core.job_summary import JobSummary
from auditor.core.model import Verdict
from auditor.render.safe_text import ELLIPSIS, terminal_safe

#: the default table's width limit, in characters
WIDTH = 120

#: (header, audit-JSON key, alignment) of every column; NOTES is the last, from the findings
_COLUMNS = {
    "NAMESPACE": ("namespace", "<"),
    "JOB": ("job", "<"),
    "TEAM": ("team", "<"),
    "GPUS": ("gpus", ">"),
    "GPU-H": ("gpu_hours", ">"),
    "UTIL": ("gpu_util", ">"),
    "SM": ("sm_active", ">"),
    "TENSOR": ("tensor_active", ">"),
    "DRAM": ("dram_active", ">"),
    "MFU~": ("mfu_estimate", ">"),
    "REF": ("mfu_reference", ">"),
    "CLASS": ("mfu_class", "<"),
    "COV": ("coverage", ">"),
    "WASTE-H": ("waste_gpu_hours", ">"),
    "GAP-H": ("recoverable_gpu_hours", ">"),
    "VERDICT": ("verdict", "<"),
    "NOTES": ("", "<"),
}
DEFAULT = ("NAMESPACE", "JOB", "GPUS", "GPU-H", "UTIL", "SM", "MFU~", "WASTE-H", "GAP-H", "VERDICT", "NOTES")
WIDE = tuple(_COLUMNS)
#: the columns cut to fit, in the order they give up width, each with the narrowest it gets
_FLEX = {"JOB": 28, "NOTES": 9, "NAMESPACE": 9}
_GAP = 2

_PERCENT = {"gpu_util", "sm_active", "tensor_active", "dram_active", "mfu_estimate", "mfu_reference", "coverage"}
#: the MFU cell where the estimate means nothing: no tensor-core work
MFU_NA = "n/a"
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


def mfu_means_nothing(summary: JobSummary) -> bool:
    """Whether the job's MFU estimate means nothing: its tensor cores do no work (verdict
    ``no_tensor_cores``), so the figure says only that, and the advice is the verdict's (use a
    tensor-core precision), not a gap to close."""
    return summary.verdict is Verdict.NO_TENSOR_CORES


def _cell(summary: JobSummary, key: str) -> str:
    if key == "team":
        return terminal_safe(summary.team or "-")
    if key == "mfu_estimate" and summary.mfu_estimate is not None and mfu_means_nothing(summary):
        return MFU_NA
    v = summary.value_of(key)
    if key == "gpu_util" and v is None and summary.means.gr_engine_active is not None:
        # the busy signal is GR_ENGINE_ACTIVE: on MIG (no GPU_UTIL there), or where GPU_UTIL was garbage
        return f"{summary.means.gr_engine_active * 100:.0f}%{_busy_mark(summary)}"
    if v is None or v == "":
        return "-"
    if key in _PERCENT:
        pct = float(str(v)) * 100
        return f"{pct:.1f}%" if 0 < pct < 10 else f"{pct:.0f}%"
    if key == "gpus":
        return gpus_text(float(str(v)))
    if key in ("gpu_hours", "waste_gpu_hours", "recoverable_gpu_hours"):
        return f"{float(str(v)):.2f}"
    return terminal_safe(str(v))


#: the UTIL cell's mark when it shows GR_ENGINE_ACTIVE: a MIG instance, or a whole GPU whose
#: GPU_UTIL samples were all garbage (saying "MIG" there sent admins looking for MIG)
MIG_MARK, NO_UTIL_MARK = "*", "†"


def _busy_mark(summary: JobSummary) -> str:
    return MIG_MARK if any(g.mig_instance for g in summary.per_gpu) else NO_UTIL_MARK


def notes(codes: Iterable[str]) -> str:
    """Short tags for the notable non-verdict findings (straggler, idle GPUs, ...), from the
    findings' codes."""
    return ", ".join(_NOTES[c] for c in codes if c in _NOTES)


def _fit(columns: Sequence[str], widths: list[int], limit: int) -> list[int]:
    """``widths`` narrowed, flexible columns first and widest first, until the line fits ``limit``."""
    widths = list(widths)
    flex = [i for i, c in enumerate(columns) if c in _FLEX]
    while sum(widths) + _GAP * (len(widths) - 1) > limit:
        room = [i for i in flex if widths[i] > _FLEX[columns[i]]]
        if not room:
            break  # the fixed columns alone are wider than the limit: print them whole
        widest = max(room, key=lambda i: (widths[i], -list(_FLEX).index(columns[i])))
        widths[widest] -= 1
    return widths


def _cut(text: str, width: int, *, middle: bool) -> str:
    """``text`` in ``width`` characters: a job name loses the middle of its name
    (``Pod/transfor…batch4-stall``: the kind and the distinguishing suffix stay), anything else
    its end."""
    text = terminal_safe(text)
    if len(text) <= width or not middle or width < 5:
        return terminal_safe(text, width)
    kind, slash, name = text.partition("/")
    prefix = kind + slash if slash and len(kind) + 1 + 8 <= width else ""
    room = width - len(prefix) - 1
    rest = text[len(prefix) :]
    return prefix + rest[: room // 2] + ELLIPSIS + rest[len(rest) - (room - room // 2) :]


def format_table(summaries: Sequence[JobSummary], *, wide: bool = False, width: int = WIDTH) -> str:
    """The verdict table as text (ends with a newline); an empty list gives a one-line note.

    The default layout fits ``width`` columns (header, rows and footer); ``wide`` has every
    column and cuts nothing.
    """
    if not summaries:
        return "no GPU jobs found in the window\n"
    columns = WIDE if wide else DEFAULT
    rows = [
        [notes(f.code for f in s.findings) if c == "NOTES" else _cell(s, _COLUMNS[c][0]) for c in columns]
        for s in summaries
    ]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    if not wide:
        widths = _fit(columns, widths, width)
    aligns = [_COLUMNS[c][1] for c in columns]

    def line(cells: Sequence[str]) -> str:
        cut = [_cut(c, w, middle=col == "JOB") for c, w, col in zip(cells, widths, columns)]
        return "  ".join(f"{c:{a}{w}}" for c, a, w in zip(cut, aligns, widths)).rstrip()

    out = [line(columns)] + [line(r) for r in rows]
    total_h = sum(s.gpu_hours or 0.0 for s in summaries)
    fig = of_jobs(summaries)
    footer = f"{len(summaries)} jobs ({fig.flagged} flagged), {total_h:.2f} GPU-hours"
    if fig.measured_gpu_hours > 0:
        room = f"; healthy jobs' {fig.headroom_gpu_hours:.2f} are headroom" if fig.headroom_gpu_hours > 0 else ""
        footer += f", {fig.waste_gpu_hours:.2f} waste GPU-hours (flagged jobs' idle SMs{room})"
    out.append(footer)
    gaps = [s.recoverable_gpu_hours for s in summaries if s.recoverable_gpu_hours is not None]
    if gaps:
        out.append(
            f"{sum(gaps):.2f} GPU-hours recoverable at the reference MFU of their class or lineage "
            f"({len(gaps)} of {len(summaries)} jobs have a reference)"
        )
    marks = {_busy_mark(s) for s in summaries if s.means.gpu_util is None and s.means.gr_engine_active is not None}
    if MIG_MARK in marks:
        out.append(f"{MIG_MARK} = MIG, utilization from GR_ENGINE_ACTIVE")
    if NO_UTIL_MARK in marks:
        out.append(
            f"{NO_UTIL_MARK} = no usable GPU_UTIL samples (dropped as garbage), utilization from GR_ENGINE_ACTIVE"
        )
    if any(s.mfu_estimate is not None for s in summaries):
        out.append(
            "MFU~ = share of the dense tensor peak of the precision in use (bf16, FP8, TF32"
            + ("; MIG: the slice's" if any(g.mig_instance for s in summaries for g in s.per_gpu) else "")
            + ")"
            + (f"; {MFU_NA} = no tensor work" if any(mfu_means_nothing(s) for s in summaries) else "")
        )
    if gaps:
        out.append(
            "GAP-H = GPU-hours not needed at the reference MFU (the MFU gap, which holds WASTE-H's idle time too)"
        )
    return "\n".join(out) + "\n"
