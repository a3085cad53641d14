"""``gpu-auditor doctor``: check the telemetry chain and say what to fix (see :mod:`auditor.doctor`)."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone

from auditor.cli.audit import add_prometheus_flags, source_from_args
from auditor.timeparse import parse_duration


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
    p.add_argument("--lookback", metavar="DURATION", default="1h", help="how far back to look for series (default 1h)")
    p.add_argument("--output", choices=("text", "json"), default="text")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from auditor.doctor import as_json, format_checks, run_checks

    lookback = parse_duration(args.lookback, what="--lookback")
    source = source_from_args(args)
    try:
        checks = run_checks(source, datetime.now(timezone.utc), lookback)
    finally:
        source.close()
    if args.output == "json":
        print(json.dumps(as_json(checks), indent=2))
    else:
        print(format_checks(checks))
    return 1 if any(c.failed for c in checks) else 0
