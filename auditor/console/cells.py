"""The console's cells: how a time, GPU-hours, a share and a duration print, and the job list's
rows (a page may hold 10,000 of them: made here, one f-string a row, not cell by cell through
the template)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from markupsafe import Markup

from auditor.console.svg import esc


def t(value: datetime | None) -> str:
    """A time as the console prints it (UTC, minutes)."""
    return "" if value is None else value.isoformat(" ", "minutes")[:16]


def hours(value: float | None) -> str:
    return "" if value is None else f"{value:,.1f}"


def pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def span(d: timedelta) -> str:
    """A duration in the largest whole unit that fits (3d, 4h, 30m, 0m)."""
    s = int(d.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}" + (f"{(s % size) // 3600}h" if unit == "d" and s % size >= 3600 else "")
    return f"{s}s"


def job_rows(base: str, rows: Sequence[Any], badges: Mapping[str, Markup]) -> Markup:
    """The job list's rows, one f-string each: a page may hold 10,000 of them, and through the
    template each of their 14 values cost a call of its own (the page took 2.3 times as long,
    bench/console_bench.py). The same bytes as the template's cells: every text through
    :func:`~auditor.console.svg.esc` (times and figures hold no character HTML would read)."""
    b = esc(base)
    cache: dict[str, str] = {}  # namespaces, kinds and teams repeat: each is escaped once

    def e(text: str) -> str:
        done = cache.get(text)
        if done is None:
            done = cache[text] = esc(text)
        return done

    return Markup(
        "".join(
            f'<tr><td><a href="{b}/jobs/{r.id}">{e(r.namespace)}/{e(r.kind)}/{esc(r.name)}</a></td>'
            f"<td>{e(r.team)}</td><td>{badges[r.verdict]}</td>"
            f"<td>{hours(r.gpu_hours)}</td><td>{hours(r.waste_gpu_hours)}</td><td>{pct(r.sm_active)}</td>"
            f"<td>{pct(r.tensor_active)}</td><td>{pct(r.mfu_estimate) or 'n/a'}</td>"
            f"<td>{hours(r.recoverable_gpu_hours)}</td><td>{t(r.start)}</td><td>{t(r.end)}</td>"
            f"<td>{'running' if r.running else 'ended'}</td></tr>"
            for r in rows
        )
    )
