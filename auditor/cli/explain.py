"""``gpu-auditor explain NAMESPACE/KIND/NAME``: the numbers and windows behind one job's verdict.

Everything comes from the store (the job's last summary and its rollup buckets), so ``explain``
needs no Prometheus and shows exactly what the verdict was computed from. The time-series picture
is a unicode sparkline per GPU — GPU utilization (the number users see) above SM activity (what
the SMs really did) — where a blank cell means *no data* for that bucket, never zero. ``--png``
draws the same series with matplotlib (Agg backend, no display needed).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence, SupportsFloat

from auditor.cli.names import cluster_name
from auditor.cli.output import add_output_flag
from auditor.cli.storeopts import add_store_flags
from auditor.core.admission import AdmissionFacts, format_wait
from auditor.core.figures import gpu_name, gpus_text, natural_key
from auditor.core.identity import JobKey
from auditor.core.job_snooze import snooze_lines
from auditor.core.job_summary import JobSummary, rfc3339
from auditor.core.metrics import SPECS, Metric
from auditor.core.mfu import LINEAGE_BEST
from auditor.core.model import Bucket, JobRef
from auditor.errors import BadInput
from auditor.render.lineage import SHOWN_CHARS, lineage_json, lineage_lines
from auditor.render.safe_text import terminal_safe
from auditor.render.table import mfu_means_nothing

if TYPE_CHECKING:
    from auditor.core.gate import LineageHistory
    from auditor.store import Store

BARS = "▁▂▃▄▅▆▇█"
NO_DATA = " "
#: the rows of the picture, top to bottom: (label, metric)
SERIES = (
    ("gpu util", Metric.GPU_UTIL),
    ("gr engine", Metric.GR_ENGINE_ACTIVE),
    ("SM active", Metric.SM_ACTIVE),
    ("tensor", Metric.TENSOR_ACTIVE),
    ("DRAM", Metric.DRAM_ACTIVE),
)
MAX_COLUMNS = 72


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "explain",
        help="show the numbers and time windows behind one job's verdict",
        description=(
            "Print one audited job's verdict, findings with their evidence, per-GPU means and a per-bucket "
            "picture of GPU utilization against SM activity, from the store. A pod of an audited job "
            "(NAMESPACE/Pod/NAME) explains that job. Exit 1 if the job is not in the store."
        ),
    )
    p.add_argument("job", metavar="NAMESPACE/KIND/NAME", help="e.g. team-a/Pod/train-0 or ml/Job/bert-finetune")
    add_store_flags(p)
    p.add_argument(
        "--cluster", type=cluster_name, metavar="NAME", help="the job's cluster, where several share one store"
    )
    p.add_argument("--png", metavar="FILE", help="also draw the time series into a PNG file")
    add_output_flag(p, "the explanation as text, or the summary and buckets as JSON", ("text", "json"))
    p.set_defaults(handler=run)


def parse_ref(text: str) -> tuple[str, str, str]:
    try:
        key = JobKey.parse(text, cluster="")
    except ValueError:
        raise BadInput(f"job {text!r}: use NAMESPACE/KIND/NAME, e.g. team-a/Pod/train-0") from None
    return key.namespace, key.kind, key.name


def _owner_of_pod(store: "Store", namespace: str, pod: str, cluster: str | None) -> tuple[int, JobRef] | None:
    """The audited job that pod ``namespace/pod`` belonged to (None: no stored bucket of it).

    A pod name reused by several jobs (a StatefulSet's ``-0`` across re-creations) is ambiguous:
    :class:`BadInput` listing the jobs, so the user picks one.
    """
    owners = store.jobs_of_pod(namespace, pod, cluster)
    if len(owners) > 1:
        names = ", ".join(f"{_ref(j)} (cluster {j.cluster})" for _, j in owners)
        raise BadInput(f"pod {namespace}/{pod} belonged to several audited jobs: {names}; explain one of them")
    return owners[0] if owners else None


def _ref(job: JobRef) -> str:
    return f"{job.namespace}/{job.kind}/{job.name}"


def run(args: argparse.Namespace) -> int:
    import sys

    from auditor.cli.storeopts import command_settings, open_store, require_jobs
    from auditor.store.admissions import AdmissionStore

    namespace, kind, name = parse_ref(args.job)
    if args.png and not Path(args.png).parent.exists():
        raise BadInput(f"--png {args.png}: directory {Path(args.png).parent} does not exist")
    settings = command_settings(args)
    store = open_store(settings, read_only=True)
    try:
        require_jobs(store, args.cluster)
        found = store.find_job(namespace, kind, name, args.cluster)
        if found is None and kind[:1].islower():
            kind = kind[:1].upper() + kind[1:]
            found = store.find_job(namespace, kind, name, args.cluster)
        if found is None and kind.lower() == "pod":
            found = _owner_of_pod(store, namespace, name, args.cluster)
            if found is not None:
                owner = found[1]
                print(
                    f"gpu-auditor: pod {namespace}/{name} belongs to the audited job {_ref(owner)} "
                    f"(cluster {owner.cluster}): explaining that job",
                    file=sys.stderr,
                )
        if found is None:
            print(
                f"gpu-auditor: no audited job {namespace}/{kind}/{name} in store {store.display_url}"
                + (f" (cluster {args.cluster})" if args.cluster else "")
                + "; run `gpu-auditor audit` over its time range first",
                file=sys.stderr,
            )
            return 1
        job_id, job = found
        doc = next(
            (s for s in store.summaries(cluster=job.cluster, namespace=namespace) if s.get("job") == job.job),
            None,
        )
        summary = JobSummary.from_json(doc, f"the stored summary of {job.key}") if doc is not None else None
        buckets = store.buckets(job_id)
        admission = AdmissionStore(store).facts(job_id)
        from auditor import compose

        now = compose.clock().now()
        lineage = _lineage_history(store, job, now)
        # issue 30: who paused this job's escalation ladder, until when
        snoozes = store.job_snoozes().of_job(JobKey(job.cluster, job.namespace, job.kind, job.name))
    finally:
        store.close()
    if summary is None:
        print(f"gpu-auditor: job {job.key} has buckets but no summary yet; re-run the audit", file=sys.stderr)
        return 1
    # issue 32: right-sizing advice (docs/rightsizing.md), shown only where a slice or class fits
    from auditor.core.rightsizing import finding as right_size_finding
    from auditor.core.rightsizing import price_of, right_size

    rs = right_size(summary, settings.rightsizing.rules(), price_of(settings.reports.prices, summary.gpu_model))
    advice = right_size_finding(rs, settings.reports.currency) if settings.rightsizing.enabled else None
    if args.output == "json":
        out: dict = {"summary": summary.to_json()}
        if admission is not None:  # only jobs that went through a Kueue queue have them
            out["admission"] = admission.to_json()
        if lineage is not None:  # only a lineage with other runs or acknowledgements has a history
            out["lineage"] = lineage_json(lineage, now)
        if snoozes:  # only a job whose escalation was snoozed
            out["escalation_snoozes"] = [s.to_json() for s in snoozes]
        if advice is not None:  # only a job a smaller slice or GPU class would hold
            out["right_size"] = {"code": advice.code, "message": advice.message, "evidence": advice.evidence}
        out["buckets"] = [_bucket_json(b) for b in buckets]
        print(json.dumps(out, indent=2, default=str))
    else:
        print(render(summary, buckets, admission))
        if advice is not None:
            print(f"\nright-sizing: [{advice.code}] {advice.message}")
        if lineage is not None:
            print("\n" + "\n".join(lineage_lines(lineage, job.job, now)))
        if snoozes:
            print("\n" + "\n".join(terminal_safe(line) for line in snooze_lines(snoozes, now)))
    if args.png:
        draw_png(summary, buckets, args.png)
        print(f"wrote {args.png}", file=sys.stderr)
    return 0


def _lineage_history(store: "Store", job: JobRef, now: datetime) -> "LineageHistory | None":
    """The history of the job's lineage when it has one beyond the job (other runs, acknowledgements)."""
    from auditor.render.lineage import has_history
    from auditor.store.lineage import LineageHistoryReader

    history = LineageHistoryReader(store).history_of_job(job.namespace, job.kind, job.name, job.cluster, now)
    return history if history is not None and has_history(history) else None


# -- text --------------------------------------------------------------------------------------------


def _pct(v: SupportsFloat | None) -> str:
    return "-" if v is None else f"{float(v) * 100:.1f}%"


def _num(v: SupportsFloat | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(float(v))


def render(summary: JobSummary, buckets: Sequence[Bucket], admission: AdmissionFacts | None = None) -> str:
    """The whole explanation as text (with Kueue's admission facts when the job was queued)."""
    s = summary
    out: list[str] = []
    t = terminal_safe  # every name and message below comes from the cluster: one line each, bounded
    out.append(
        f"{t(s.namespace, SHOWN_CHARS)}/{t(s.job, SHOWN_CHARS)}   cluster {t(s.cluster, SHOWN_CHARS)}   "
        f"team {t(s.team or '-', SHOWN_CHARS)}"
    )
    out.append(f"verdict: {s.verdict.value}")
    out.append(
        f"observed {rfc3339(s.start)} → {rfc3339(s.end)}"
        f"   (audit window {rfc3339(s.window_start)} → {rfc3339(s.window_end)})"
    )
    out.append(
        f"GPUs {gpus_text(s.gpus)} {t(s.gpu_model or '', 40)}   "
        f"GPU-hours {_num(s.gpu_hours)}   waste {_num(s.waste_gpu_hours)}   "
        f"coverage {_pct(s.coverage)}   sample interval {_num(s.scrape_interval_s, '{:g}')} s"
    )
    means = (
        ("gpu_util", s.means.gpu_util),
        ("gr_engine_active", s.means.gr_engine_active),
        ("sm_active", s.means.sm_active),
        ("sm_occupancy", s.means.sm_occupancy),
        ("tensor_active", s.means.tensor_active),
        ("dram_active", s.means.dram_active),
        ("fp32_active", s.means.fp32_active),
    )
    out.append("means: " + "   ".join(f"{k} {_pct(v)}" for k, v in means) + f"   MFU~ {_pct(s.mfu_estimate)}")
    out.extend(mfu_lines(s))
    if admission is not None:
        out.append(kueue_line(admission))
    if s.stats:
        out.append("")
        out.append(f"  {'metric':<18}{'mean':>11}{'p10':>11}{'p50':>11}{'p90':>11}{'samples':>9}{'dropped':>9}")
        for metric in sorted(s.stats, key=lambda m: m.value):
            st = s.stats[metric]
            unit = _stat_format(metric)
            out.append(
                f"  {metric.value:<18}{unit(st.mean):>11}{unit(st.p10):>11}{unit(st.p50):>11}"
                f"{unit(st.p90):>11}{st.samples:>9}{st.dropped:>9}"
            )
    if s.findings:
        out.append("")
        out.append("findings:")
        for f in s.findings:
            out.append(f"  - [{f.code}] {t(f.message)}")
            if f.evidence:
                out.append("      evidence: " + ", ".join(f"{t(k, 40)}={_short(v)}" for k, v in f.evidence.items()))
    if s.per_gpu:
        out.append("")
        out.append("per GPU:")
        out.append(f"  {'pod':<24}{'gpu':<26}{'util':>8}{'SM':>8}{'tensor':>8}{'DRAM':>8}{'cov':>7}  verdict")
        named = [(g, gpu_name(g.hostname or "", g.gpu or "", g.uuid, g.mig_instance or "")) for g in s.per_gpu]
        for g, gpu in sorted(named, key=lambda x: (natural_key(x[0].pod), natural_key(x[1]))):
            util = g.means.gpu_util if g.means.gpu_util is not None else g.means.gr_engine_active
            out.append(
                f"  {t(g.pod, 23):<24}{t(gpu, 25):<26}"
                f"{_pct(util):>8}{_pct(g.means.sm_active):>8}{_pct(g.means.tensor_active):>8}"
                f"{_pct(g.means.dram_active):>8}{_pct(g.coverage):>7}  {g.verdict.value}"
            )
    if buckets:
        out.append("")
        out.extend(timeline(buckets))
    return "\n".join(out)


def mfu_lines(s: JobSummary) -> list[str]:
    """What the job's MFU is, what it could be (the reference and where it comes from) and what
    the gap costs in GPU-hours; ``n/a`` with the no-tensor-cores advice where the tensor cores did
    no work (issue 28)."""
    if s.mfu_estimate is None:
        return ["MFU: - (no tensor-pipe series: nothing to estimate it from)"]
    mig = any(g.mig_instance for g in s.per_gpu)
    peak = "the dense tensor peak of the precision in use (bf16, FP8 or TF32)" + (
        ", of the MIG slice's share of it" if mig else ""
    )
    if mfu_means_nothing(s):
        return [
            f"MFU: n/a: the tensor cores did no work (tensor activity {_pct(s.means.tensor_active)}), so an MFU "
            "relative to their peak says nothing; use them first: bf16 mixed precision (torch.autocast), or TF32 "
            "for FP32 matmuls (the no_tensor_cores finding)"
        ]
    out = [f"MFU: {_pct(s.mfu_estimate)} (estimated) of {peak}"]
    if s.mfu_reference is None:
        out.append(
            "  could be: no reference MFU applies (no workload class with one, no better earlier run of its "
            "lineage): no MFU gap is charged"
        )
        return out
    source = (
        "its lineage's best earlier run"
        if s.mfu_class == LINEAGE_BEST
        else f"the reference of its workload class {terminal_safe(s.mfu_class or '?', SHOWN_CHARS)}"
    )
    out.append(f"  could be: {_pct(s.mfu_reference)}, {source}")
    gap = s.recoverable_gpu_hours
    if gap is not None and s.gpu_hours:
        out.append(
            f"  the gap costs {_num(gap)} of its {_num(s.gpu_hours)} GPU-hours ({gap / s.gpu_hours * 100:.0f} %): "
            "at the reference MFU the same work would not have needed them"
        )
    elif gap is not None:
        out.append(f"  the gap costs {_num(gap)} GPU-hours")
    return out


def kueue_line(f: AdmissionFacts) -> str:
    """One line of what Kueue says: the admitting queue, the wait, evictions and requeues."""
    queue = f"ClusterQueue {f.cluster_queue or '?'}" + (f" (LocalQueue {f.local_queue})" if f.local_queue else "")
    if f.admitted_at is not None:
        waited = (
            f"waited {format_wait(f.queue_wait_s)} until admitted {f.admitted_at.isoformat().replace('+00:00', 'Z')}"
        )
    elif f.pending and f.eviction_count == 0:
        waited = f"waiting for admission since {f.created.isoformat().replace('+00:00', 'Z')}"
    else:
        waited = "first admission not seen"
    parts = [f"kueue: {queue}", waited]
    if f.eviction_count:
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(f.evictions.items()))
        parts.append(f"evictions {f.eviction_count} ({reasons})")
        parts.append(f"requeues {f.requeues}")
        if f.pending:
            parts.append("waiting for re-admission")
        elif f.last_admitted_at is not None:
            parts.append(f"re-admitted after {format_wait(f.last_wait_s)}")
    return "   ".join(parts)


def _stat_format(metric: Metric) -> Callable[[SupportsFloat | None], str]:
    """How the statistics table writes ``metric``, from its unit in :data:`SPECS`: activities in
    percent, byte rates in GB/s (a PCIe rate in percent read 3857924932.3 %), memory in GiB (the
    exporter's MiB), power in W, clocks in MHz: every value with its unit."""
    spec = SPECS[metric]
    if spec.unit == "ratio":
        return _pct
    if spec.unit == "B/s":
        return lambda v: "-" if v is None else f"{float(v) / 1e9:.2f} GB/s"
    if spec.unit == "MiB":
        return lambda v: "-" if v is None else f"{float(v) / 1024:.1f} GiB"
    if spec.unit in ("W", "MHz"):
        return lambda v: "-" if v is None else f"{float(v):.0f} {spec.unit}"
    return lambda v: _num(v, "{:.1f}") + (f" {spec.unit}" if v is not None and spec.unit else "")


def _short(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    text = json.dumps(v, default=str) if isinstance(v, (list, dict)) else str(v)
    text = terminal_safe(text)
    return text if len(text) <= 80 else text[:77] + "..."


def _series(
    buckets: Sequence[Bucket],
) -> tuple[list[datetime], dict[tuple[str, str], dict[Metric, dict[datetime, tuple[float, int]]]]]:
    """Bucket starts, and per (pod, GPU) per metric: start → (total, count); the GPU by its one
    name (:func:`~auditor.core.figures.gpu_name`), so the pictures sort and read as the findings."""
    starts = sorted({b.start for b in buckets})
    per: dict[tuple[str, str], dict[Metric, dict[datetime, tuple[float, int]]]] = defaultdict(lambda: defaultdict(dict))
    for b in buckets:
        key = (b.pod.pod, gpu_name(b.gpu.hostname, b.gpu.index, b.gpu.uuid, b.gpu.instance))
        t, c = per[key][b.metric].get(b.start, (0.0, 0))
        per[key][b.metric][b.start] = (t + b.total, c + b.count)
    return starts, per


def sparkline(values: Sequence[float | None]) -> str:
    """Ratios 0–1 as bars on a fixed scale; ``None`` (no data) is a blank, never a zero bar."""
    out = []
    for v in values:
        if v is None:
            out.append(NO_DATA)
        else:
            i = int(round(max(0.0, min(1.0, v)) * (len(BARS) - 1)))
            out.append(BARS[i])
    return "".join(out)


def _grid(buckets: Sequence[Bucket]) -> tuple[datetime, timedelta, int]:
    """The picture's time axis: the first bucket's start, the bucket width, and the number of
    bucket slots from the first to the last bucket, *including* the slots no bucket fills."""
    width = buckets[0].end - buckets[0].start
    first = min(b.start for b in buckets)
    last = max(b.start for b in buckets)
    return first, width, (last - first) // width + 1


def _columns(
    series: dict[datetime, tuple[float, int]], first: datetime, width: timedelta, per_col: int, n_cols: int
) -> list[float | None]:
    """Mean per column of ``per_col`` adjacent bucket slots (sum/count combine exactly); a
    column whose slots hold no bucket is None, so a gap in the data shows as a gap."""
    totals, counts = [0.0] * n_cols, [0] * n_cols
    for start, (t, c) in series.items():
        i = ((start - first) // width) // per_col
        totals[i] += t
        counts[i] += c
    return [t / c if c else None for t, c in zip(totals, counts)]


def timeline(buckets: Sequence[Bucket]) -> list[str]:
    """The per-GPU picture: one sparkline row per metric, time left to right, one column per
    equal slice of time (a stretch without buckets is blank, never closed up)."""
    if not buckets:
        return []
    _, per = _series(buckets)
    first, width, slots = _grid(buckets)
    per_col = max(1, -(-slots // MAX_COLUMNS))
    n_cols = -(-slots // per_col)
    col_span = width * per_col
    lines = [
        f"timeline: {first.isoformat().replace('+00:00', 'Z')} → "
        f"{(first + width * slots).isoformat().replace('+00:00', 'Z')}, one column per {_span(col_span)}, "
        f"bars 0–100 %, blank = no data"
    ]
    for (pod, gpu_key), metrics in sorted(per.items(), key=lambda kv: (natural_key(kv[0][0]), natural_key(kv[0][1]))):
        lines.append(f"  {terminal_safe(pod, SHOWN_CHARS)} {terminal_safe(gpu_key, SHOWN_CHARS)}")
        for label, metric in SERIES:
            if metric not in metrics:
                continue
            cols = _columns(metrics[metric], first, width, per_col, n_cols)
            known = [v for v in cols if v is not None]
            mean = f"{sum(known) / len(known) * 100:5.1f}%" if known else "    -"
            lines.append(f"    {label:<10}│{sparkline(cols)}│ {mean}")
    return lines


def _span(d) -> str:
    s = int(d.total_seconds())
    if s % 3600 == 0:
        return f"{s // 3600} h"
    if s % 60 == 0:
        return f"{s // 60} min"
    return f"{s} s"


def _bucket_json(b: Bucket) -> dict:
    return {
        "pod": b.pod.pod,
        "namespace": b.pod.namespace,
        "gpu": b.gpu.key,
        "metric": b.metric.value,
        "start": b.start.isoformat().replace("+00:00", "Z"),
        "end": b.end.isoformat().replace("+00:00", "Z"),
        "mean": b.mean,
        "count": b.count,
        "min": b.minimum if b.count else None,
        "max": b.maximum if b.count else None,
        "dropped": b.dropped,
    }


# -- PNG ---------------------------------------------------------------------------------------------


def _points(
    series: dict[datetime, tuple[float, int]], starts: list[datetime], width: timedelta
) -> tuple[list[datetime], list[float]]:
    """The plotted points in percent; a NaN where buckets are missing, so the line breaks
    across a gap instead of drawing one straight segment as if it were data."""
    xs: list[datetime] = []
    ys: list[float] = []
    for s in starts:
        if s not in series or not series[s][1]:
            continue
        if xs and s - xs[-1] > width:
            xs.append(xs[-1] + width)
            ys.append(float("nan"))
        xs.append(s)
        ys.append(series[s][0] / series[s][1] * 100)
    return xs, ys


def draw_png(summary: JobSummary, buckets: Sequence[Bucket], path: str) -> None:
    """GPU util vs SM activity (and tensor, DRAM) per GPU over time, one panel per GPU (at most 8)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    starts, per = _series(buckets)
    keys = sorted(per)[:8]
    if not keys:
        raise BadInput("no buckets stored for this job: nothing to draw")
    fig, axes = plt.subplots(len(keys), 1, figsize=(10, 2.2 * len(keys) + 0.8), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        for label, metric in SERIES:
            series = per[key].get(metric)
            if not series:
                continue
            xs, ys = _points(series, starts, buckets[0].end - buckets[0].start)
            ax.plot(xs, ys, marker=".", linewidth=1.2, label=label)
        ax.set_ylim(-2, 102)
        ax.set_ylabel("%")
        ax.set_title(f"{key[0]} on {key[1]}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize=8, ncol=5)
    fig.suptitle(f"{summary.namespace}/{summary.job}: {summary.verdict.value}", fontsize=11)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
