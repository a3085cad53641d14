"""``gpu-auditor doctor``: check the telemetry chain and say what to fix (see :mod:`auditor.doctor`)."""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import TYPE_CHECKING

from auditor.cli.output import add_output_flag
from auditor.cli.promopts import add_prometheus_flags, command_source, prometheus_overrides
from auditor.cli.storeopts import CONFIG_HELP
from auditor.timeparse import check_range, parse_duration

#: the bucket width of doctor's read (auditor/doctor.py), for the bound on --lookback
DOCTOR_BUCKET = timedelta(minutes=5)

if TYPE_CHECKING:
    from auditor.doctor import Check
    from auditor.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="check the telemetry chain (Prometheus, DCGM series, profiling fields, labels) and say what to fix",
        description=(
            "Check that Prometheus is reachable, which DCGM series exist (classic, DCGM 4.6 or dcgm-exporter 4.9 names), whether "
            "the profiling fields (SM activity) are on, which label convention is in use, how many GPUs are "
            "attributed to pods, and whether kube-state-metrics is there. Exit 1 if a required check fails."
        ),
    )
    add_prometheus_flags(p)
    p.add_argument("--config", metavar="FILE", help=f"{CONFIG_HELP}; its prometheus: section, under these flags")
    p.add_argument("--lookback", metavar="DURATION", default="1h", help="how far back to look for series (default 1h)")
    add_output_flag(p, "the checks", ("text", "json"))
    kube = p.add_mutually_exclusive_group()
    kube.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="also check the cluster's Kueue through this kubeconfig: its feature gates, the efficiency gate's "
        "AdmissionCheck (Active?) and the ClusterQueues that run it",
    )
    kube.add_argument("--in-cluster", action="store_true", help="as --kubeconfig, with the pod's service account")
    p.add_argument(
        "--kueue-only",
        action="store_true",
        help="with --kubeconfig/--in-cluster: check only Kueue and the efficiency gate, not Prometheus "
        "(the gate runbook's check, docs/gate.md)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from auditor import compose
    from auditor.cli.storeopts import command_settings
    from auditor.doctor import as_json, format_checks, run_checks
    from auditor.errors import BadInput

    if args.kueue_only and not (args.kubeconfig or args.in_cluster):
        raise BadInput("--kueue-only needs --kubeconfig or --in-cluster (it checks the cluster's Kueue)")
    lookback = parse_duration(args.lookback, what="--lookback")
    overrides = prometheus_overrides(args)
    if args.kubeconfig or args.in_cluster:
        overrides["kubernetes"] = {"kubeconfig": args.kubeconfig, "in_cluster": bool(args.in_cluster)}
    settings = command_settings(args, overrides)
    now = compose.clock().now()
    check_range(
        now - lookback, now, max_range=settings.max_audit_range, width=DOCTOR_BUCKET, what=f"--lookback {args.lookback}"
    )
    checks: list[Check] = []
    if not args.kueue_only:
        source = command_source(args, settings)
        try:
            checks = run_checks(source, now, lookback)
        finally:
            source.close()
    if args.kubeconfig or args.in_cluster:
        checks.extend(_kueue_checks(settings))
    if settings.gate.ack_link_key_file:
        from auditor.doctor import ack_link_key_check
        from auditor.policy.config import read_link_key

        checks.append(
            ack_link_key_check(settings.gate.ack_link_key_file, settings.gate.ack_link_base_url, read_link_key)
        )
    if args.output == "json":
        print(json.dumps(as_json(checks), indent=2))
    else:
        print(format_checks(checks))
    return 1 if any(c.failed for c in checks) else 0


def _kueue_checks(settings: "Settings") -> "list[Check]":
    """The cluster's Kueue as the gate and the chosen options need it: its version, the
    PriorityBoost gate (a policy's requeue.lowerPriorityBy; probed and said even when no policy
    uses it), the AdmissionGatedBy gate (gate.holdBeforeQuota), the gate's AdmissionCheck and the
    ClusterQueues that run it."""
    from auditor import compose
    from auditor.doctor import (
        FAIL,
        WARN,
        Check,
        gate_admission_check_checks,
        gate_queue_checks,
        kueue_feature_checks,
        kueue_priority_boost_check,
    )
    from auditor.errors import SourceUnavailable

    try:
        out = kueue_feature_checks(compose.kueue_findings(settings))
        if not any(c.name == "Kueue PriorityBoost gate" for c in out):  # no policy lowers priority: still said
            out.append(kueue_priority_boost_check(*compose.kueue_priority_boost(settings)))
        checks, queues, error = compose.kueue_gate_objects(settings)
    except SourceUnavailable as exc:  # a checklist line like Prometheus's, not the end of the report
        return [
            Check(
                "Kubernetes API reachable",
                FAIL,
                str(exc),
                "check the kubeconfig's server, the network path and TLS",
                True,
            )
        ]
    if checks is None:
        return [*out, Check("gate: AdmissionCheck", WARN, f"could not check: {error}")]
    out += gate_admission_check_checks(checks, enabled=settings.gate.enabled)
    if queues is None:
        return [
            *out,
            Check(
                "gate: ClusterQueues",
                WARN,
                f"could not check: {error}",
                "the operator's ServiceAccount may only get ClusterQueues: run doctor with a kubeconfig "
                "that may list them (an admin's)",
            ),
        ]
    out += gate_queue_checks([str(c["metadata"]["name"]) for c in checks], queues)
    return out
