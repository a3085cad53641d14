"""``gpu-auditor traces``: inspect recorded GPU traces and turn them into backfillable series.

``traces phases TRACE`` lists a trace's workload phases with their steady-state means;
``traces to-openmetrics TRACE --job NS/POD=PHASE ... --out FILE`` writes dcgm-exporter-format
OpenMetrics for ``promtool tsdb create-blocks-from openmetrics`` (backfill into Prometheus).
TRACE is a path or a bundled trace name (``h200-microbench``, ``h200-demo-cluster``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from auditor.core.metrics import Metric, Naming
from auditor.core.model import PodRef
from auditor.errors import BadInput
from auditor.timeparse import parse_duration, parse_time
from auditor.traces import BUNDLED, CONVENTIONS, TraceJob, load_trace, make_gpus, trace_to_openmetrics


def _metrics(text: str, flag: str) -> set[Metric]:
    out = set()
    for name in (t.strip() for t in text.split(",") if t.strip()):
        try:
            out.add(Metric(name))
        except ValueError:
            raise BadInput(f"{flag}: unknown metric {name!r} (known: {', '.join(m.value for m in Metric)})") from None
    return out


def parse_job_spec(spec: str, gpus: int) -> tuple[PodRef, tuple[str, ...]]:
    """``NS/POD=PHASE`` (one phase on ``gpus`` GPUs) or ``NS/POD=P1,P2,...`` (one per GPU)."""
    target, sep, phases = spec.partition("=")
    ns, slash, pod = target.partition("/")
    if not sep or not slash or not ns or not pod or not phases:
        raise BadInput(f"--job {spec!r}: expected NAMESPACE/POD=PHASE[,PHASE...]")
    names = tuple(p.strip() for p in phases.split(",") if p.strip())
    if len(names) == 1:
        names = names * gpus
    return PodRef(ns, pod, "main"), names


def _to_openmetrics(args: argparse.Namespace) -> int:
    from auditor import compose

    now = compose.clock().now()
    trace = load_trace(args.trace)
    end = parse_time(args.end, now, what="--end")
    duration = parse_duration(args.duration, what="--duration")
    interval = parse_duration(args.interval, what="--interval")
    include: set[Metric] | None = None
    if args.only:
        include = _metrics(args.only, "--only")
    if args.drop:
        include = (include if include is not None else set(Metric)) - _metrics(args.drop, "--drop")
    specs: list[tuple[PodRef, tuple[str, ...]]] = [parse_job_spec(s, args.gpus) for s in args.job or []]
    if args.all_phases:
        specs += [(PodRef(args.all_phases, p.replace("_", "-"), "main"), (p,) * args.gpus) for p in trace.phases()]
    if not specs:
        raise BadInput("give at least one --job NAMESPACE/POD=PHASE or --all-phases NAMESPACE")
    jobs: list[TraceJob] = []
    next_index = 0
    for pod, phases in specs:
        for p in set(phases):
            trace.steady(p)  # fails early with the list of phases
        gpus = make_gpus(len(phases), args.node, model=trace.gpu_model, first_index=next_index)
        next_index += len(phases)
        jobs.append(TraceJob(pod=pod, gpus=gpus, phase=phases[0], gpu_phases=phases))
    text = trace_to_openmetrics(
        trace,
        jobs,
        end=end,
        duration=duration,
        interval=interval,
        convention=args.convention,
        include=include,
        hostname_label=args.hostname_label,
        dcgm46_names=args.dcgm46_names,
        naming=Naming(args.naming) if args.naming else None,
    )
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8")
        print(
            f"wrote {args.out}: {len(jobs)} pods, {next_index} GPUs, {duration} at {interval} ending {end.isoformat()}",
            file=sys.stderr,
        )
    return 0


def _phases(args: argparse.Namespace) -> int:
    trace = load_trace(args.trace)
    cols = [Metric.GPU_UTIL, Metric.SM_ACTIVE, Metric.TENSOR_ACTIVE, Metric.DRAM_ACTIVE, Metric.FP32_ACTIVE]
    print(f"{'PHASE':32} {'SAMPLES':>7} " + " ".join(f"{m.value:>13}" for m in cols))
    for p in trace.phases():
        means = trace.steady_means(p)
        cells = " ".join(f"{means[m] * 100:12.1f}%" if m in means else f"{'-':>13}" for m in cols)
        print(f"{p:32} {len(trace.steady(p)):7d} {cells}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("traces", help="inspect recorded GPU traces; convert them to OpenMetrics for backfill")
    sub = p.add_subparsers(dest="traces_command", metavar="ACTION", required=True)
    trace_help = f"trace CSV path or bundled name ({', '.join(BUNDLED)})"

    ph = sub.add_parser("phases", help="list a trace's workload phases and their steady-state means")
    ph.add_argument("trace", metavar="TRACE", help=trace_help)
    ph.set_defaults(handler=_phases)

    om = sub.add_parser(
        "to-openmetrics",
        help="write dcgm-exporter-format OpenMetrics for promtool backfill",
        description="Each phase's steady state (from its second sample on) is repeated in order to fill "
        "--duration at --interval; the series end at --end (keep it inside Prometheus's retention).",
    )
    om.add_argument("trace", metavar="TRACE", help=trace_help)
    om.add_argument(
        "--job",
        action="append",
        metavar="NS/POD=PHASE[,PHASE...]",
        help="a pod replaying PHASE on --gpus GPUs, or one phase per GPU (repeatable)",
    )
    om.add_argument("--all-phases", metavar="NS", help="one pod per workload phase in namespace NS")
    om.add_argument("--gpus", type=int, default=1, help="GPUs per --job with a single phase (default 1)")
    om.add_argument("--node", default="gpu-node-1", help="hostname label value (default gpu-node-1)")
    om.add_argument("--duration", default="1h", help="how long each series lasts (default 1h)")
    om.add_argument("--interval", default="15s", help="scrape interval (default 15s)")
    om.add_argument("--end", default="now", help="when the series end: RFC 3339 or now[-6h] (default now)")
    om.add_argument("--convention", choices=CONVENTIONS, default="pod", help="pod labels as pod=… or exported_pod=…")
    om.add_argument("--hostname-label", choices=("Hostname", "hostname"), default="Hostname")
    om.add_argument("--dcgm46-names", action="store_true", help="use DCGM 4.6 *_RATIO metric names")
    om.add_argument(
        "--naming",
        choices=[n.value for n in Naming],
        help="exporter names and units: classic (default), dcgm-4.6, exporter-4.9 (GPU_UTIL a ratio, clocks in Hz) "
        "or exporter-4.10 (4.9 with the PCIe rates *_BYTES_PER_SECOND)",
    )
    om.add_argument("--drop", metavar="M,M", help="metrics to leave out, e.g. fp32_active,sm_active")
    om.add_argument("--only", metavar="M,M", help="only these metrics")
    om.add_argument("--out", default="-", metavar="FILE", help="output file (default: stdout)")
    om.set_defaults(handler=_to_openmetrics)
