"""Charts as inline SVG text, drawn on the server: no script, no CDN, no image files.

Each function returns one ``<svg>`` element sized by its ``viewBox`` (it scales with the page,
a phone gets the same chart narrower). Every label passes through :func:`esc`: team and job
names come from the cluster and may hold markup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape

from auditor.render import METRIC_COLORS as _METRIC_COLORS

#: a colour per timeline metric (distinct from the verdict colours)
#: the timeline's metrics in the colours every chart uses (auditor/render: one colour per metric)
METRIC_COLORS = {m: _METRIC_COLORS[m] for m in ("gpu_util", "sm_active", "tensor_active", "dram_active")}
METRIC_LABELS = {"gpu_util": "util", "sm_active": "SM", "tensor_active": "tensor", "dram_active": "DRAM"}
#: line colours for several series (teams)
PALETTE = ("#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#546e7a")


def esc(text: object) -> str:
    """Text safe in element content and in quoted attributes."""
    return escape(str(text), quote=True)


def clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters with an ellipsis (a chart's label has a fixed room)."""
    return text if len(text) <= n else text[: n - 1] + "…"


def _f(x: float) -> str:
    return f"{x:.1f}"


def timeline(
    series: Mapping[str, Sequence[tuple[datetime, float]]],
    start: datetime,
    end: datetime,
    *,
    title: str,
    width: int = 640,
    height: int = 200,
) -> str:
    """Lines of fractions (0..1) over ``[start, end]``, one per metric, with a legend."""
    left, right, top, bottom = 36, 8, 38, 22
    w, h = width - left - right, height - top - bottom
    span = max((end - start).total_seconds(), 1.0)

    def x(t: datetime) -> float:
        return left + w * min(max((t - start).total_seconds() / span, 0.0), 1.0)

    def y(v: float) -> float:
        return top + h * (1.0 - min(max(v, 0.0), 1.0))

    parts = [
        f'<svg class="chart timeline" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">',
        f"<title>{esc(title)}</title>",
        f'<text x="{left}" y="14" class="ctitle">{esc(title)}</text>',
    ]
    for frac in (0.0, 0.5, 1.0):
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{_f(y(frac))}" y2="{_f(y(frac))}" class="grid"/>')
        parts.append(
            f'<text x="{left - 4}" y="{_f(y(frac) + 4)}" class="axis" text-anchor="end">{int(frac * 100)}%</text>'
        )
    parts.append(f'<text x="{left}" y="{height - 6}" class="axis">{esc(start.strftime("%m-%d %H:%M"))}</text>')
    parts.append(
        f'<text x="{left + w}" y="{height - 6}" class="axis" text-anchor="end">{esc(end.strftime("%m-%d %H:%M"))}</text>'
    )
    lx = left
    for metric, points in series.items():
        color = METRIC_COLORS.get(metric, "#333")
        if points:
            path = " ".join(f"{_f(x(t))},{_f(y(v))}" for t, v in points)
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5" data-metric="{esc(metric)}"/>'
            )
        parts.append(f'<rect x="{lx}" y="20" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{lx + 13}" y="29" class="legend">{esc(METRIC_LABELS.get(metric, metric))}</text>')
        lx += 70
    parts.append("</svg>")
    return "".join(parts)


def hbars(items: Sequence[tuple[str, float, str]], *, title: str, unit: str = "", width: int = 640) -> str:
    """Horizontal bars: (label, value, colour), longest bar the largest value."""
    row, left, top = 22, 150, 22
    height = top + row * max(len(items), 1) + 6
    top_value = max((v for _, v, _ in items), default=0.0) or 1.0
    w = width - left - 80
    parts = [
        f'<svg class="chart bars" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">',
        f"<title>{esc(title)}</title>",
        f'<text x="4" y="14" class="ctitle">{esc(title)}</text>',
    ]
    if not items:
        parts.append(f'<text x="4" y="{top + 14}" class="axis">no data</text>')
    for i, (label, value, color) in enumerate(items):
        yy = top + i * row
        bw = max(w * value / top_value, 0.0)
        parts.append(f'<text x="{left - 6}" y="{yy + 14}" class="axis" text-anchor="end">{esc(clip(label, 22))}</text>')
        parts.append(f'<rect x="{left}" y="{yy + 3}" width="{_f(bw)}" height="{row - 6}" fill="{esc(color)}"/>')
        parts.append(f'<text x="{_f(left + bw + 4)}" y="{yy + 14}" class="axis">{value:,.1f}{esc(unit)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def lines(
    labels: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    title: str,
    unit: str = "",
    width: int = 640,
    height: int = 200,
) -> str:
    """Lines over categories (weeks), one per series (team), with a legend below."""
    left, right, top = 48, 36, 22  # room for the last category's label, centred on its point
    legend_rows = (len(series) + 3) // 4
    bottom = 22 + 16 * legend_rows
    w, h = width - left - right, height - top - bottom
    values = [v for vs in series.values() for v in vs if v is not None]
    top_value = max(values, default=0.0) or 1.0
    n = max(len(labels), 1)

    def x(i: int) -> float:
        return left + (w * i / (n - 1) if n > 1 else w / 2)

    def y(v: float) -> float:
        return top + h * (1.0 - v / top_value)

    parts = [
        f'<svg class="chart lines" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">',
        f"<title>{esc(title)}</title>",
        f'<text x="{left}" y="14" class="ctitle">{esc(title)}</text>',
        f'<line x1="{left}" x2="{left + w}" y1="{_f(y(0))}" y2="{_f(y(0))}" class="grid"/>',
        f'<text x="{left - 4}" y="{_f(y(top_value) + 4)}" class="axis" text-anchor="end">{top_value:,.0f}{esc(unit)}</text>',
        f'<text x="{left - 4}" y="{_f(y(0) + 4)}" class="axis" text-anchor="end">0</text>',
    ]
    for i, label in enumerate(labels):
        parts.append(f'<text x="{_f(x(i))}" y="{top + h + 14}" class="axis" text-anchor="middle">{esc(label)}</text>')
    for k, (name, vs) in enumerate(series.items()):
        color = PALETTE[k % len(PALETTE)]
        pts = [(x(i), y(v)) for i, v in enumerate(vs) if v is not None]
        if len(pts) > 1:
            path = " ".join(f"{_f(a)},{_f(b)}" for a, b in pts)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for a, b in pts:
            parts.append(f'<circle cx="{_f(a)}" cy="{_f(b)}" r="3" fill="{color}"/>')
        lx, ly = left + (k % 4) * (w / 4), top + h + 30 + 16 * (k // 4)
        parts.append(f'<rect x="{_f(lx)}" y="{_f(ly - 9)}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{_f(lx + 13)}" y="{_f(ly)}" class="legend">{esc(clip(name, 18))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def mfu_gauge(
    mfu: float | None, reference: float | None, *, source: str | None, gpu_hours: float | None, width: int = 480
) -> str:
    """One job's MFU on a 0–100 % scale beside its reference (a dashed mark), the gap between them
    shaded: what the job does, what its class (or its own best run) does, and what the difference
    costs. Without an estimate the chart says n/a (no tensor activity), never 0."""
    left, right, top, bar = 12, 12, 34, 22
    height = top + bar + 34
    w = width - left - right

    def x(v: float) -> float:
        return left + w * min(max(v, 0.0), 1.0)

    title = "MFU against its reference" if reference is not None else "MFU (no reference applies)"
    parts = [
        f'<svg class="chart gauge" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">',
        f"<title>{esc(title)}</title>",
        f'<text x="{left}" y="14" class="ctitle">{esc(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{w}" height="{bar}" fill="#eceff1"/>',
    ]
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        anchor = "start" if frac == 0 else "end" if frac == 1 else "middle"
        parts.append(
            f'<text x="{_f(x(frac))}" y="{top + bar + 14}" class="axis" text-anchor="{anchor}">{int(frac * 100)}%</text>'
        )
    if mfu is None:
        parts.append(
            f'<text x="{left + 6}" y="{top + 15}" class="axis">n/a: no tensor activity, no MFU estimate</text></svg>'
        )
        return "".join(parts)
    parts.append(f'<rect x="{left}" y="{top}" width="{_f(x(mfu) - left)}" height="{bar}" fill="#2e7d32"/>')
    label = f"MFU {100 * mfu:.1f}%"
    if reference is not None:
        if reference > mfu:
            parts.append(
                f'<rect x="{_f(x(mfu))}" y="{top}" width="{_f(x(reference) - x(mfu))}" height="{bar}" '
                'fill="#ef9a9a" data-k="gap"/>'
            )
        parts.append(
            f'<line x1="{_f(x(reference))}" x2="{_f(x(reference))}" y1="{top - 6}" y2="{top + bar + 4}" '
            'stroke="#c62828" stroke-width="2" stroke-dasharray="4 2"/>'
        )
        label += f" · reference {100 * reference:.0f}% ({source or 'class'})"
        if gpu_hours is not None and reference > 0:
            label += f" · {gpu_hours * max(0.0, 1.0 - mfu / reference):,.1f} GPU-h recoverable"
    parts.append(f'<text x="{left}" y="{top + bar + 30}" class="legend">{esc(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
