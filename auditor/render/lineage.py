"""A job's lineage and its history, as ``explain`` and the weekly report show them.

The gate judges a re-submission by its lineage's runs, so the owner reading why a job was held
needs the same picture: which runs count, what they were flagged, who acknowledged and until
when. A lineage with no other run and no acknowledgement has no history to show: callers print
nothing for it (:func:`has_history`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from auditor.core.gate import LineageHistory, LineageRun
from auditor.render.safe_text import terminal_safe

#: the longest job name or reason a line shows (the JSON keeps them whole)
SHOWN_CHARS = 120

#: runs listed, newest first
SHOWN_RUNS = 10


def has_history(history: LineageHistory) -> bool:
    """More than one run, or an acknowledgement or snooze: something beyond the job itself."""
    return len(history.runs) > 1 or bool(history.acks)


def _iso(t: datetime | None) -> str | None:
    return t.isoformat().replace("+00:00", "Z") if t is not None else None


def _verdict_counts(runs: list[LineageRun]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in runs:
        out[r.verdict] = out.get(r.verdict, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def lineage_json(history: LineageHistory, now: datetime) -> dict[str, Any]:
    """The lineage block of ``explain -o json`` and of a report's job entry."""
    ack = history.acknowledged(now)
    snooze = history.snoozed(now)
    runs = list(history.runs)
    return {
        "lineage": str(history.key),
        "cluster": history.key.cluster,
        "runs": len(runs),
        "verdicts": _verdict_counts(runs),
        "history": [
            {
                "job": r.job,
                "verdict": r.verdict,
                "start": _iso(r.start),
                "end": _iso(r.end),
                "gpu_hours": r.gpu_hours,
                "findings": list(r.findings),
            }
            for r in reversed(runs[-SHOWN_RUNS:])
        ],
        "open_findings": history.open_findings(now),
        "acknowledged": None
        if ack is None
        else {"by": ack.by, "at": _iso(ack.at), "until": _iso(ack.until), "reason": ack.reason, "via": ack.via},
        "snoozed_until": _iso(snooze.until) if snooze is not None else None,
        "acknowledgements": [
            {"kind": a.kind.value, "by": a.by, "at": _iso(a.at), "until": _iso(a.until), "reason": a.reason}
            for a in history.acks
        ],
    }


def lineage_lines(history: LineageHistory, job: str, now: datetime) -> list[str]:
    """The lineage section of ``explain``'s text: the runs newest first (this job marked), then
    the acknowledgements."""
    runs = list(history.runs)
    counts = ", ".join(f"{n} {v}" for v, n in _verdict_counts(runs).items())
    t = terminal_safe  # names, reasons and who acknowledged come from users: one line each
    key, cluster = t(str(history.key), SHOWN_CHARS), t(history.key.cluster, SHOWN_CHARS)
    out = [f"lineage {key} (cluster {cluster}): {len(runs)} run(s): {t(counts, SHOWN_CHARS)}"]
    for r in reversed(runs[-SHOWN_RUNS:]):
        day = r.when.date().isoformat() if r.when else "?"
        hours = f"{r.gpu_hours:.1f} GPU-h" if r.gpu_hours is not None else "- GPU-h"
        mark = "   ← this job" if r.job == job else ""
        out.append(f"  {day}  {t(r.job, SHOWN_CHARS):<40} {t(r.verdict, 18):<18} {hours}{mark}")
    if len(runs) > SHOWN_RUNS:
        out.append(f"  … {len(runs) - SHOWN_RUNS} older run(s)")
    for a in history.acks:
        until = f" until {_iso(a.until)}" if a.until else ""
        state = "" if a.valid(now) else " (ended)" if a.at <= now else " (later)"
        why = f": {t(a.reason, SHOWN_CHARS)}" if a.reason else ""
        out.append(f"  {a.kind.value} by {t(a.by, SHOWN_CHARS)} at {_iso(a.at)}{until} via {t(a.via, 40)}{state}{why}")
    return out


def lineage_brief(history: LineageHistory, now: datetime) -> dict[str, Any]:
    """The lineage block of a report's top-list job: its runs by verdict and who acknowledged it."""
    ack = history.acknowledged(now)
    return {
        "lineage": str(history.key),
        "runs": len(history.runs),
        "verdicts": _verdict_counts(list(history.runs)),
        "acknowledged_by": ack.by if ack is not None else None,
        "acknowledged_until": _iso(ack.until) if ack is not None else None,
    }
