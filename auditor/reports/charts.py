"""The report's charts: matplotlib (Agg) figures → base64 PNG for ``data:`` URIs.

Every value drawn comes from the report document, so a chart can never disagree with the
tables beside it. Figures are small (100 dpi, a few tens of kB) so a report mails well and
loads fast on a phone.
"""

from __future__ import annotations

import base64
import io
from typing import Any, Mapping, Sequence

from auditor.render import METRIC_COLORS, VERDICT_COLORS
from auditor.reports.aggregate import VERDICTS

#: the colours every chart uses for these metrics (auditor/render.METRIC_COLORS)
SM_COLOR, WASTE_COLOR = METRIC_COLORS["sm_active"], METRIC_COLORS["waste"]
UNMEASURED_COLOR, TENSOR_COLOR = METRIC_COLORS["unmeasured"], METRIC_COLORS["tensor_active"]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def hours_by_team(rows: Sequence[Mapping[str, Any]]) -> str:
    """Stacked bars per team: SM-active, wasted and unmeasured GPU-hours (they sum to the
    allocated GPU-hours)."""
    series = [
        (label, color, [float(r.get(key) or 0.0) for r in rows])
        for key, label, color in (
            ("sm_active_gpu_hours", "SM-active", SM_COLOR),
            ("waste_gpu_hours", "wasted (SMs idle)", WASTE_COLOR),
            ("unmeasured_gpu_hours", "unmeasured", UNMEASURED_COLOR),
        )
    ]
    return _team_bars(rows, series, xlabel="GPU-hours", ncol=3, fontsize=8)


def _team_bars(
    rows: Sequence[Mapping[str, Any]],
    series: list[tuple[str, str, list[float]]],
    *,
    xlabel: str,
    ncol: int,
    fontsize: int,
) -> str:
    """Stacked horizontal bars, one per team, of ``series`` ((label, colour, values) each)."""
    plt = _plt()
    labels = [str(r["team"]) for r in rows]
    n = len(rows)
    fig, ax = plt.subplots(figsize=(7.5, 0.42 * n + 1.5), layout="constrained")
    left = [0.0] * n
    for label, color, vals in series:
        ax.barh(range(n), vals, left=left, color=color, label=label, height=0.65)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(n), labels, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=ncol, fontsize=fontsize, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def trend(points: Sequence[Mapping[str, Any]]) -> str:
    """Weekly GPU-hours (bars: SM-active vs the rest), efficiency and MFU (lines, right axis)."""
    plt = _plt()
    weeks = [str(p["week"]) for p in points]
    x = range(len(points))
    fig, ax = plt.subplots(figsize=(7.5, 3.0), layout="constrained")
    hours = [float(p.get("gpu_hours") or 0.0) for p in points]
    waste = [float(p.get("waste_gpu_hours") or 0.0) for p in points]
    unmeasured = [float(p.get("unmeasured_gpu_hours") or 0.0) for p in points]
    active = [max(0.0, h - w - u) for h, w, u in zip(hours, waste, unmeasured)]
    ax.bar(x, active, color=SM_COLOR, label="SM-active GPU-h", width=0.6)
    ax.bar(x, waste, bottom=active, color=WASTE_COLOR, label="waste GPU-h", width=0.6)
    ax.bar(
        x,
        unmeasured,
        bottom=[a + w for a, w in zip(active, waste)],
        color=UNMEASURED_COLOR,
        label="unmeasured",
        width=0.6,
    )
    for i, p in zip(x, points):
        if not p.get("jobs"):
            ax.text(i, 0, "no data", ha="center", va="bottom", rotation=90, fontsize=8, color="#777")
    ax.set_xticks(list(x), weeks, fontsize=8)
    ax.set_ylabel("GPU-hours")
    ax2 = ax.twinx()
    eff = [None if p.get("efficiency") is None else float(p["efficiency"]) * 100 for p in points]
    xs = [i for i, e in zip(x, eff) if e is not None]
    ys = [e for e in eff if e is not None]
    ax2.plot(xs, ys, color="#111", marker="o", label="efficiency %")
    mfu = [None if p.get("mfu") is None else float(p["mfu"]) * 100 for p in points]
    mx = [i for i, m in zip(x, mfu) if m is not None]
    ax2.plot(mx, [m for m in mfu if m is not None], color=TENSOR_COLOR, marker="s", linestyle="--", label="MFU %")
    ax2.set_ylim(0, 100)
    ax2.set_ylabel("efficiency (SM activity), MFU %")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=5, fontsize=8, frameon=False)
    return _png(fig)


def verdicts_by_team(rows: Sequence[Mapping[str, Any]]) -> str:
    """Stacked bars per team: number of jobs by verdict."""
    series = []
    for verdict in VERDICTS:
        vals = [float(r.get("verdicts", {}).get(verdict, 0)) for r in rows]
        if any(vals):
            series.append((verdict, VERDICT_COLORS.get(verdict, "#999"), vals))
    return _team_bars(rows, series, xlabel="jobs", ncol=4, fontsize=7)
