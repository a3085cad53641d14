"""``gpu-auditor actions [--since 7d] [--state S]``: the policy actions recorded in the store.

Every action a policy step claimed is a row in the store, done or not: an alert that went
nowhere (no destination for the team), an annotation turned off by ``features``, a requeue
refused by its cap. This lists them, so that an action which did not happen can be seen and its
reason read, not only those that did. The store is found as for every other command
(:mod:`auditor.cli.storeopts`).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from auditor.cli.names import cluster_name
from auditor.cli.output import add_output_flag
from auditor.cli.storeopts import add_store_flags
from auditor.errors import BadInput
from auditor.render.safe_text import terminal_safe

STATES = ("claimed", "done", "failed", "skipped", "waiting", "queued")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "actions",
        help="list the policy actions recorded in the store (done, skipped, failed, waiting, queued)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument(
        "--since",
        default="7d",
        metavar="T",
        help="from this time on: a duration back from now (7d, default), now-6h or RFC 3339",
    )
    p.add_argument("--state", action="append", choices=STATES, help="only actions in this state (repeatable)")
    p.add_argument(
        "--cluster", type=cluster_name, metavar="NAME", help="only this cluster, where several share one store"
    )
    add_output_flag(p, "the actions", ("table", "json", "yaml"))
    add_store_flags(p)
    p.set_defaults(handler=run)


def since_time(text: str, now: datetime) -> datetime:
    """``7d`` (back from now), ``now-7d`` or an RFC 3339 time."""
    from auditor.timeparse import parse_duration, parse_time

    value = text.strip()
    if value[:1].isdigit() and not any(c in value for c in "T:"):
        return now - parse_duration(value, what="--since")
    return parse_time(value, now, what="--since")


def as_dict(row: Any) -> dict:
    """One action as JSON-ready data (the ``--output json`` element)."""
    return {
        "updated_at": row.updated_at.isoformat().replace("+00:00", "Z"),
        "created_at": row.created_at.isoformat().replace("+00:00", "Z"),
        "cluster": row.job.cluster,
        "namespace": row.job.namespace,
        "job": f"{row.job.kind}/{row.job.name}",
        "policy": row.policy,
        "action": row.action,
        "state": row.state,
        "attempts": row.attempts,
        "why": row.result.get("why"),
        "error": row.error,
        "dedup_key": row.dedup_key,
    }


def _cut(text: str, width: int) -> str:
    """At most ``width`` characters, control characters neutralised (names and errors come
    from the cluster and from receivers)."""
    return terminal_safe(text, width)


def table(rows: list[dict]) -> str:
    """Fits 120 columns: the reason (why or error) takes what the other columns leave."""
    lines = [f"{'UPDATED':<20} {'STATE':<8} {'ACTION':<9} {'POLICY':<20} {'JOB':<30} REASON"]
    for r in rows:
        reason = r["error"] or r["why"] or ""
        lines.append(
            f"{r['updated_at'][:19]:<20} {r['state']:<8} {r['action']:<9} {_cut(r['policy'], 20):<20} "
            f"{_cut(r['namespace'] + '/' + r['job'], 30):<30} {_cut(reason, 28)}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import sys

    from auditor import compose
    from auditor.cli.storeopts import command_settings, open_store, require_jobs
    from auditor.store.decisions import DecisionStore

    now = compose.clock().now()
    since = since_time(args.since, now)
    if since > now:
        raise BadInput(f"--since {args.since}: in the future")
    store = open_store(command_settings(args), read_only=True)
    try:
        require_jobs(store, args.cluster)
        rows = [as_dict(r) for r in DecisionStore(store).actions(since=since, states=args.state, cluster=args.cluster)]
    finally:
        store.close()
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    elif args.output == "yaml":
        from auditor.cli.output import dump_yaml

        sys.stdout.write(dump_yaml(rows))
    else:
        print(table(rows))
    print(f"{len(rows)} action(s) since {since.isoformat().replace('+00:00', 'Z')}", file=sys.stderr)
    return 0
