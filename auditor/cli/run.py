"""``gpu-auditor run [--once] [--output json] [--config FILE]``: the operator.

Settings come from ``--config`` (the file the Helm chart renders), then ``GPU_AUDITOR_*``
variables, then these flags (auditor/settings.py). ``--once`` runs one cycle under the Lease and
exits; with ``--output json`` it prints, in the audit JSON shape, the cumulative summary of every
job that cycle touched. Without ``--once`` it runs until SIGTERM/SIGINT, then releases the Lease.
``--no-leader-election`` runs without a Lease; ``--dry-run`` decides and records but writes nothing
to the cluster (no Lease, annotation, Event or requeue) and sends no notification or report.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from auditor.cli.names import cluster_name
from auditor.cli.output import add_output_flag, print_jobs
from auditor.cli.promopts import add_prometheus_flags, prometheus_auth, prometheus_overrides
from auditor.cli.storeopts import CONFIG_HELP
from auditor.core.identity import JobKey
from auditor.render.safe_text import terminal_safe

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="the operator: audit the cluster's GPU jobs on a schedule (leader-elected)",
        description=(
            "Discover GPU pods through the Kubernetes API, resolve them to their jobs and teams, and audit "
            "their DCGM history from Prometheus every interval into the store. Only the holder of the Lease "
            "audits. Exit codes: 0 done, 1 failed, 2 bad usage or settings."
        ),
    )
    p.add_argument("--config", metavar="FILE", help=f"{CONFIG_HELP}; docs/operator.md lists the keys")
    p.add_argument("--once", action="store_true", help="run one cycle (taking the Lease) and exit")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="decide and record the would-do decisions in the store, but write nothing to the cluster "
        "(no Lease, annotation, Event or requeue) and send no notification or report",
    )
    p.add_argument(
        "--no-leader-election",
        action="store_true",
        help="run without the Lease (settings: leader_election.enabled: false); for one operator only",
    )
    p.add_argument(
        "--lease-namespace",
        metavar="NS",
        help="namespace of the Lease (settings: leader_election.namespace; default: $POD_NAMESPACE "
        "in a pod, else the kubeconfig context's namespace)",
    )
    p.add_argument(
        "--shard",
        type=int,
        metavar="N",
        help="audit only shard N (0-based) of --total-shards, by namespace hash (settings: sharding.shard; "
        "default: the StatefulSet ordinal of $POD_NAME); docs/scale.md",
    )
    p.add_argument(
        "--total-shards",
        type=int,
        metavar="N",
        help="number of shards the cluster is split into (settings: sharding.total_shards; default 1)",
    )
    add_output_flag(p, "with --once: the touched jobs as a verdict table or as the audit JSON")
    add_prometheus_flags(p)
    kube = p.add_mutually_exclusive_group()
    kube.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    kube.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    p.add_argument("--db", metavar="URL", help="store: sqlite:///path or postgresql://... (settings: store.url)")
    p.add_argument("--policies", metavar="DIR", help="policy directory (settings: policies.dir)")
    p.add_argument(
        "--cluster", type=cluster_name, metavar="NAME", help="cluster name recorded on each job (settings: cluster)"
    )
    p.set_defaults(handler=run)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that were given, as settings keys (flags win over the file and the environment)."""
    out: dict[str, Any] = prometheus_overrides(args)
    kube: dict[str, Any] = {}
    if args.kubeconfig:
        kube.update(kubeconfig=args.kubeconfig, in_cluster=False)
    if args.in_cluster:
        kube["in_cluster"] = True
    if kube:
        out["kubernetes"] = kube
    if args.db:
        out["store"] = {"url": args.db, "url_env": None}
    if args.policies:
        out["policies"] = {"dir": args.policies}
    if args.cluster:
        out["cluster"] = args.cluster
    election: dict[str, Any] = {}
    if args.no_leader_election:
        election["enabled"] = False
    if args.lease_namespace:
        election["namespace"] = args.lease_namespace
    if election:
        out["leader_election"] = election
    sharding: dict[str, Any] = {}
    if args.shard is not None:
        sharding["shard"] = args.shard
    if args.total_shards is not None:
        sharding["total_shards"] = args.total_shards
    if sharding:
        out["sharding"] = sharding
    return out


def run(args: argparse.Namespace) -> int:
    from auditor import compose
    from auditor.settings import load_cli_settings

    settings = load_cli_settings(args.config, overrides=overrides_from_args(args))
    logging.getLogger().setLevel(
        min(logging.getLogger().level or logging.WARNING, getattr(logging, settings.log_level.upper()))
    )
    # every adapter (Prometheus with the flags' credentials, store, API client, clock) from the
    # composition root: the same as audit's and doctor's
    # one cycle: an API server that cannot be reached is one line before any watch starts (the
    # long-running operator keeps retrying instead, its informers say so in the log)
    given = {"api": compose.kube_api(settings, dry_run=args.dry_run, check=True)} if args.once else {}
    op = compose.operator(settings, auth=prometheus_auth(args), dry_run=args.dry_run, **given)
    if args.once:
        result = op.run_once()
        # the stored documents (with the operator's final/ended and kube)
        docs = [s.to_json() for s in result.summaries]
        if args.dry_run:
            _attach_decisions(docs, result.decisions)
        print_jobs(result.summaries, docs, args.output, sys.stdout)
        w = result.window
        print(
            f"cycle {w.start.isoformat()} → {w.end.isoformat()}: {len(result.summaries)} job(s) summarized, "
            f"{len(result.finalized)} final, {result.queries} Prometheus queries",
            file=sys.stderr,
        )
        wrong = 0
        if args.dry_run:
            _print_dry_run(result.decisions, policies=op.policies is not None)
        else:
            wrong = _print_undone(result.decisions, op.last_delivery)
        for warning in result.warnings:
            print(f"warning: {terminal_safe(warning)}", file=sys.stderr)
        return 1 if wrong else 0

    if args.dry_run:
        log.warning(
            "dry run: no Lease, nothing written to the cluster, no notification or report; "
            "would-do decisions are recorded in the store"
        )

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: shutting down%s", signum, " (releasing the Lease)" if op.elector is not None else "")
        op.request_stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    op.run_forever()
    return 0


def _attach_decisions(summaries: list[dict], decisions: list) -> None:
    """Each summary gets its ``policy_decisions`` (as ``audit --policies`` prints them)."""
    by_job: dict[str, list] = {}
    for d in decisions:
        by_job.setdefault(d.job, []).append(d.as_dict())
    for s in summaries:
        s["policy_decisions"] = by_job.get(str(JobKey.of_document(s)), [])


def _print_undone(decisions: list, delivery: Any) -> int:
    """One line per decision not carried out in full (an alert with no destination, a failed
    action) and one for the alerts sent after the cycle; returns how many went wrong."""
    wrong = 0
    for d in decisions:
        ok, text = d.outcome()
        if not ok:
            wrong += 1
            print(f"policy {d.policy} on {d.job} (step {d.step}): {text}", file=sys.stderr)
    if delivery is not None and (delivery.tried or delivery.left):
        waiting = len(delivery.retrying) + delivery.left
        print(
            f"alerts: {len(delivery.sent)} delivered, {len(delivery.failed)} failed"
            + (f", {waiting} still queued (the running operator retries them)" if waiting else ""),
            file=sys.stderr,
        )
        wrong += len(delivery.failed)
    return wrong


def _print_dry_run(decisions: list, *, policies: bool) -> None:
    from auditor.cli.policy import print_decisions

    if policies:
        print_decisions(decisions, act=True, file=sys.stderr)  # each line says "dry-run"
    due = sum(1 for d in decisions if d.step is not None)
    print(
        f"dry run: nothing was written to the cluster and nothing was sent; {due} would-do decision(s) "
        "recorded in the store",
        file=sys.stderr,
    )
