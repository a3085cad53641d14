"""``gpu-auditor audit``: one audit of a time range, from Prometheus into the store.

The Prometheus flags are :mod:`auditor.cli.promopts`'s, shared with ``doctor`` and ``run``; the
source, store and resolver come from the composition root (:mod:`auditor.compose`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

from auditor.cli.names import cluster_name
from auditor.cli.output import add_output_flag, print_jobs
from auditor.cli.promopts import add_prometheus_flags, command_source, prometheus_overrides
from auditor.cli.storeopts import add_store_flags
from auditor.errors import BadInput
from auditor.render.safe_text import terminal_safe
from auditor.timeparse import check_range, format_time, parse_duration, parse_time

if TYPE_CHECKING:
    from auditor.settings import Settings

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "audit",
        help="audit the GPU jobs of a time range from DCGM history in Prometheus",
        description=(
            "Read DCGM history for every pod of a time range from Prometheus, store per-job buckets and "
            "summaries, and print each job's verdict. Times are RFC 3339 (2026-11-30T09:00:00Z) or "
            "relative (now, now-6h). Exit codes: 0 done, 1 failed, 2 bad usage or input."
        ),
    )
    add_prometheus_flags(p)
    kube = p.add_mutually_exclusive_group()
    kube.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="find jobs through the Kubernetes API: owners up to the top-level job, Kueue queues, teams",
    )
    kube.add_argument("--in-cluster", action="store_true", help="as --kubeconfig, with the pod's service account")
    kube.add_argument(
        "--no-kube",
        action="store_true",
        help="jobs from metric labels alone: each pod is a job Pod/<name>, its team is its namespace",
    )
    p.add_argument("--start", required=True, metavar="T", help="start of the range: RFC 3339 or now-<duration>")
    p.add_argument("--end", default="now", metavar="T", help="end of the range (default: now)")
    add_store_flags(p)
    p.add_argument(
        "--policies", metavar="DIR", help="evaluate the policies in DIR and report their decisions (dry run)"
    )
    p.add_argument("--act", action="store_true", help="with --policies: carry out the decided actions")
    add_output_flag(p, "the jobs as a verdict table or as the audit JSON (json; yaml: the same as YAML)")
    p.add_argument(
        "--cluster",
        type=cluster_name,
        metavar="NAME",
        default="default",
        help="cluster name recorded on each job (default: default)",
    )
    p.add_argument("--bucket", metavar="DURATION", default="5m", help="rollup bucket width (default 5m)")
    p.set_defaults(handler=run)


def _resolver(args: argparse.Namespace, settings: "Settings") -> tuple[Any, Any]:
    """How pods become jobs: metric labels alone, or the Kubernetes API (the operator's resolver,
    built by the composition root from ``settings``).

    Through the API, pods the cluster no longer knows (finished and deleted before the audit)
    are audited as ``Pod/<name>`` jobs of their namespace, as with ``--no-kube``.
    """
    if args.no_kube:
        from auditor.correlate import NoKubeResolver

        return NoKubeResolver(cluster=settings.cluster), None
    from auditor import compose
    from auditor.errors import SourceUnavailable

    api = compose.kube_api(settings, check=True)  # one line if unreachable, before any watch starts
    resolver = compose.kube_resolver(settings, api).start()
    if not resolver.wait_synced(60.0):
        resolver.stop()
        raise SourceUnavailable("Kubernetes API: could not list pods and namespaces within 60 s")
    return resolver, api


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as settings keys: Prometheus, the cluster's name, where the API server is."""
    out: dict[str, Any] = {**prometheus_overrides(args), "cluster": args.cluster}
    if args.kubeconfig or args.in_cluster:
        out["kubernetes"] = {"kubeconfig": args.kubeconfig, "in_cluster": bool(args.in_cluster)}
    return out


def run(args: argparse.Namespace) -> int:
    from auditor import compose

    now = compose.clock().now()
    window = parse_window(args.start, args.end, now)
    width = parse_duration(args.bucket, what="--bucket")
    if not (args.no_kube or args.kubeconfig or args.in_cluster):
        raise BadInput(
            "say how jobs are found: --kubeconfig PATH or --in-cluster (the Kubernetes API), "
            "or --no-kube (from metric labels)"
        )
    if args.act and not args.policies:
        raise BadInput("--act needs --policies DIR")
    policies = config = None
    if args.policies:
        from auditor.cli.policy import runner_config_from_env
        from auditor.policy.loader import load_dir

        # both are BadInput (file:line; a retired variable) before any query runs
        policies = load_dir(args.policies)
        config = runner_config_from_env(args.cluster)

    from auditor.cli.storeopts import command_settings, open_store
    from auditor.engine import run_audit

    # the store (--db, GPU_AUDITOR_DATABASE_URL, the settings file), Prometheus (the file's
    # prometheus: section under the flags) and the verdict thresholds
    settings = command_settings(args, _overrides(args))
    check_range(window.start, window.end, max_range=settings.max_audit_range, width=width)
    resolver, api = _resolver(args, settings)
    try:
        source = command_source(args, settings)
        try:
            store = open_store(settings)
            try:
                result = run_audit(
                    source,
                    resolver,
                    store,
                    window,
                    now=now,
                    width=width,
                    progress=log.info,
                    thresholds=settings.thresholds,
                    mfu=compose.mfu_plan(settings),
                )
                docs = [s.to_json() for s in result.summaries]  # the audit JSON
                if api is not None:  # Kueue's admission facts of the audited jobs
                    from auditor.operator_loop.admissions import record_audit_admissions

                    record_audit_admissions(store, resolver, docs, now)
                decisions = []
                if policies is not None:
                    from auditor.policy.runner import PolicyRunner

                    kube = compose.kube_actions(api) if api is not None else None
                    runner = PolicyRunner(policies, store, kube, config)
                    decisions = runner.run_cycle(result.summaries, now=now, act=args.act)
            finally:
                store.close()
        finally:
            source.close()
    finally:
        stop = getattr(resolver, "stop", None)
        if stop is not None:
            stop()

    report = result.report
    if args.output in ("json", "yaml") and policies is not None:
        by_job: dict[str, list] = {}
        for d in decisions:
            by_job.setdefault(d.job, []).append(d.as_dict())
        for s, doc in zip(result.summaries, docs):
            doc["policy_decisions"] = by_job.get(str(s.key), [])
    print_jobs(result.summaries, docs, args.output, sys.stdout)
    wrong = 0
    if policies is not None:
        from auditor.cli.policy import print_decisions

        wrong = print_decisions(decisions, act=args.act, file=sys.stderr)
    note = (
        f"audited {len(result.summaries)} job(s), {format_time(window.start)} → {format_time(window.end)}, "
        f"from {source.url} in {report.queries} queries"
    )
    if report.dropped:
        note += "; garbage samples dropped: " + ", ".join(
            f"{m.value} {n}" for m, n in sorted(report.dropped.items(), key=lambda kv: kv[0].value)
        )
    print(note, file=sys.stderr)
    # series refused for their identity are said in the source's warnings (once per reason);
    # jobs the resolver refused (an owner's name no job key can hold) here
    refused = getattr(resolver, "rejected", None)
    for w in [*report.warnings, *(refused.lines("pods") if refused else ())]:
        print(f"warning: {terminal_safe(w)}", file=sys.stderr)  # warnings quote pod names
    return 1 if wrong else 0


def parse_window(start: str, end: str, now: datetime):  # -> Window
    """``--start``/``--end`` into a Window; an end in the future is cut at now."""
    from auditor.core.model import Window

    s = parse_time(start, now, what="--start")
    e = min(parse_time(end, now, what="--end"), now)
    if e <= s:
        raise BadInput(f"--start {start} is not before --end {end} (or now): empty range")
    return Window(s, e)
