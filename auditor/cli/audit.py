"""``gpu-auditor audit``: one audit of a time range, from Prometheus into the store.

Also home of the Prometheus connection flags, shared by ``doctor`` (and any other command that
reads Prometheus) so every command spells them the same way. Secrets are never taken as flag
values (they would show in ``ps`` and shell history): a token or password comes from a file or
from ``GPU_AUDITOR_PROMETHEUS_TOKEN`` / ``GPU_AUDITOR_PROMETHEUS_PASSWORD``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from auditor.cli.storeopts import add_store_flags
from auditor.errors import BadInput
from auditor.timeparse import format_time, parse_duration, parse_time

log = logging.getLogger(__name__)

ENV_URL = "GPU_AUDITOR_PROMETHEUS_URL"
ENV_TOKEN = "GPU_AUDITOR_PROMETHEUS_TOKEN"
ENV_PASSWORD = "GPU_AUDITOR_PROMETHEUS_PASSWORD"


def add_prometheus_flags(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """The flags that say where Prometheus is and how to talk to it."""
    g = parser.add_argument_group("Prometheus")
    g.add_argument(
        "--prometheus",
        metavar="URL",
        default=os.environ.get(ENV_URL),
        help=f"Prometheus (or Thanos/Mimir/VictoriaMetrics) query URL, e.g. http://prometheus:9090 (env {ENV_URL})",
    )
    g.add_argument("--prometheus-token-file", metavar="FILE", help=f"file holding a bearer token (or env {ENV_TOKEN})")
    g.add_argument(
        "--prometheus-user",
        metavar="USER",
        help=f"basic-auth user; password from --prometheus-password-file or env {ENV_PASSWORD}",
    )
    g.add_argument("--prometheus-password-file", metavar="FILE", help="file holding the basic-auth password")
    g.add_argument("--prometheus-ca-file", metavar="FILE", help="CA bundle to verify the server's TLS certificate")
    g.add_argument("--prometheus-insecure", action="store_true", help="do not verify TLS certificates (testing only)")
    g.add_argument(
        "--prometheus-timeout", metavar="SECONDS", type=float, default=60.0, help="per-query timeout (default 60)"
    )
    g.add_argument(
        "--prometheus-retries",
        metavar="N",
        type=int,
        default=2,
        help="retries on connection errors, 429 and 5xx (default 2)",
    )
    g.add_argument(
        "--match",
        metavar="LABEL=VALUE",
        action="append",
        default=[],
        help="extra label matcher on every DCGM series, e.g. cluster=prod where clusters share one Prometheus (repeatable)",
    )
    g.add_argument(
        "--pod-labels",
        choices=("auto", "pod", "exported_pod", "pod_name"),
        default="auto",
        help="which labels name the workload pod (default: detected; exported_pod when scraped with honorLabels: false)",
    )
    parser.set_defaults(_prometheus_required=required)


def _read_secret(path: str, what: str) -> str:
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise BadInput(f"{what} {path}: cannot read ({exc.strerror})") from None
    if not value:
        raise BadInput(f"{what} {path}: file is empty")
    return value


def source_from_args(args: argparse.Namespace):  # -> PrometheusSource
    """Build the Prometheus source from the parsed flags (BadInput for bad combinations)."""
    from auditor.sources.prometheus import PrometheusSource

    if not args.prometheus:
        raise BadInput(f"--prometheus URL is required (or set {ENV_URL})")
    token = None
    if args.prometheus_token_file:
        token = _read_secret(args.prometheus_token_file, "--prometheus-token-file")
    elif os.environ.get(ENV_TOKEN):
        token = os.environ[ENV_TOKEN].strip()
    basic = None
    if args.prometheus_user:
        if args.prometheus_password_file:
            password = _read_secret(args.prometheus_password_file, "--prometheus-password-file")
        elif os.environ.get(ENV_PASSWORD) is not None:
            password = os.environ[ENV_PASSWORD]
        else:
            raise BadInput(f"--prometheus-user needs --prometheus-password-file or env {ENV_PASSWORD}")
        basic = (args.prometheus_user, password)
    elif args.prometheus_password_file:
        raise BadInput("--prometheus-password-file needs --prometheus-user")
    if token and basic:
        raise BadInput("give a bearer token or basic auth for Prometheus, not both")
    if args.prometheus_ca_file and not Path(args.prometheus_ca_file).is_file():
        raise BadInput(f"--prometheus-ca-file {args.prometheus_ca_file}: no such file")
    if args.prometheus_timeout <= 0:
        raise BadInput("--prometheus-timeout must be positive")
    if not 0 <= args.prometheus_retries <= 10:
        raise BadInput("--prometheus-retries must be between 0 and 10")
    matchers: dict[str, str] = {}
    for item in args.match:
        label, sep, value = item.partition("=")
        if not sep or not label.strip() or not label.strip().replace("_", "a").isalnum():
            raise BadInput(f"--match {item!r}: use LABEL=VALUE, e.g. cluster=prod")
        matchers[label.strip()] = value
    return PrometheusSource(
        args.prometheus,
        bearer_token=token,
        basic_auth=basic,
        ca_file=args.prometheus_ca_file,
        insecure=args.prometheus_insecure,
        timeout=args.prometheus_timeout,
        retries=args.prometheus_retries,
        matchers=matchers,
        pod_labels=None if args.pod_labels == "auto" else args.pod_labels,
    )


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
    p.add_argument("--output", choices=("table", "json"), default="table", help="table (default) or the audit JSON")
    p.add_argument(
        "--cluster", metavar="NAME", default="default", help="cluster name recorded on each job (default: default)"
    )
    p.add_argument("--bucket", metavar="DURATION", default="5m", help="rollup bucket width (default 5m)")
    p.set_defaults(handler=run)


def _resolver(args: argparse.Namespace) -> tuple[Any, Any]:
    """How pods become jobs: metric labels alone, or the Kubernetes API (the operator's resolver).

    Through the API, pods the cluster no longer knows (finished and deleted before the audit)
    are audited as ``Pod/<name>`` jobs of their namespace, as with ``--no-kube``.
    """
    if args.no_kube:
        from auditor.correlate import NoKubeResolver

        return NoKubeResolver(cluster=args.cluster), None
    from auditor.errors import SourceUnavailable
    from auditor.kube.client import KubeConfig, api_client
    from auditor.kube.resolver import KubeResolver

    api = api_client(KubeConfig(kubeconfig=args.kubeconfig, in_cluster=args.in_cluster))
    resolver = KubeResolver(api, cluster=args.cluster).start()
    if not resolver.wait_synced(60.0):
        resolver.stop()
        raise SourceUnavailable("Kubernetes API: could not list pods and namespaces within 60 s")
    return resolver, api


def run(args: argparse.Namespace) -> int:
    now = datetime.now(timezone.utc)
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

    # the store (--db, GPU_AUDITOR_DATABASE_URL, the settings file) and the verdict thresholds
    settings = command_settings(args)
    resolver, api = _resolver(args)
    try:
        source = source_from_args(args)
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
                )
                decisions = []
                if policies is not None:
                    from auditor.policy.runner import PolicyRunner

                    kube = None
                    if api is not None:
                        from auditor.actions import KubeActions

                        kube = KubeActions(api)
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
    if args.output == "json":
        if policies is not None:
            by_job: dict[str, list] = {}
            for d in decisions:
                by_job.setdefault(d.job, []).append(d.as_dict())
            for s in result.summaries:
                key = f"{s.get('cluster') or args.cluster}/{s.get('namespace')}/{s.get('job')}"
                s["policy_decisions"] = by_job.get(key, [])
        print(json.dumps(result.summaries, indent=2, sort_keys=False, default=str))
    else:
        from auditor.render.table import format_table

        print(format_table(result.summaries))
    if policies is not None:
        from auditor.cli.policy import print_decisions

        print_decisions(decisions, act=args.act, file=sys.stderr)
    note = (
        f"audited {len(result.summaries)} job(s), {format_time(window.start)} → {format_time(window.end)}, "
        f"from {source.url} in {report.queries} queries"
    )
    if report.dropped:
        note += "; garbage samples dropped: " + ", ".join(
            f"{m.value} {n}" for m, n in sorted(report.dropped.items(), key=lambda kv: kv[0].value)
        )
    print(note, file=sys.stderr)
    for w in report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


def parse_window(start: str, end: str, now: datetime):  # -> Window
    """``--start``/``--end`` into a Window; an end in the future is cut at now."""
    from auditor.core.model import Window

    s = parse_time(start, now, what="--start")
    e = min(parse_time(end, now, what="--end"), now)
    if e <= s:
        raise BadInput(f"--start {start} is not before --end {end} (or now): empty range")
    return Window(s, e)
