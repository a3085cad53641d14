"""``gpu-auditor store prune [--dry-run]``: apply ``store.retention`` now, as the operator does hourly.

The store and the retention come from the same sources as every other command (``--db``,
``GPU_AUDITOR_DATABASE_URL``, the settings file: :mod:`auditor.cli.storeopts`; the retention
also from ``GPU_AUDITOR_STORE__RETENTION__*``). A prune touches one cluster's rows (``--cluster``,
else the settings' ``cluster`` where they set one, else the one cluster the store holds:
:func:`store_cluster`), or with ``--all-clusters`` every cluster's. It prints the rows
deleted per table, or with ``--dry-run`` the rows it would delete, deleting nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Callable

from auditor.cli.names import cluster_name
from auditor.cli.output import add_output_flag
from auditor.cli.storeopts import add_store_flags
from auditor.errors import BadInput

if TYPE_CHECKING:
    from auditor.settings import Settings
    from auditor.store import Store


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "store",
        help="maintain the store: prune what has aged out (store.retention)",
        description="Maintain the store. Exit codes: 0 done, 1 failed, 2 bad usage or settings.",
    )
    sub = p.add_subparsers(dest="store_command", metavar="SUBCOMMAND")
    prune = sub.add_parser(
        "prune",
        help="delete what is older than store.retention (the operator does this hourly)",
        description=(
            "Delete the buckets, summaries, jobs, aggregates, audit runs, escalation records and report "
            "deliveries that are older than store.retention (docs/store.md, Retention), for one cluster. "
            "Prints the rows deleted per table; --dry-run prints what would be deleted and deletes nothing."
        ),
    )
    add_store_flags(prune)
    scope = prune.add_mutually_exclusive_group()
    scope.add_argument(
        "--cluster",
        type=cluster_name,
        metavar="NAME",
        help="the cluster whose rows are pruned (default: the settings' cluster where they set one, "
        "else the one cluster the store holds)",
    )
    scope.add_argument("--all-clusters", action="store_true", help="prune the rows of every cluster in the store")
    prune.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")
    prune.add_argument(
        "--as-of",
        metavar="T",
        default="now",
        help="prune as at this time (RFC 3339 or now±DURATION; default now), e.g. to preview a later prune",
    )
    add_output_flag(prune, "the rows per table", ("table", "json"))
    prune.set_defaults(handler=_prune)
    p.set_defaults(handler=lambda _args: _usage(p))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _prune(args: argparse.Namespace) -> int:
    from auditor import compose
    from auditor.cli.storeopts import command_settings, open_store
    from auditor.store.retention import Retention, prune
    from auditor.timeparse import parse_time

    now = parse_time(args.as_of, compose.clock().now().replace(microsecond=0), what="--as-of")
    settings = command_settings(args)
    if args.cluster is not None and not args.cluster.strip():
        raise BadInput("--cluster: give a cluster name (or --all-clusters)")
    retention = Retention.from_settings(settings)
    with open_store(settings, existing=True) as store:
        cluster = (
            None
            if args.all_clusters
            else store_cluster(store, args.cluster, settings, held=lambda: clusters_in(store), also="--all-clusters")
        )
        result = prune(store, now, retention, cluster=cluster, dry_run=args.dry_run)
    if args.output == "json":
        print(json.dumps(result.as_dict(), indent=2))
        return 0
    verb = "would delete" if result.dry_run else "deleted"
    scope = "every cluster" if cluster is None else f"cluster {cluster}"
    print(
        f"{scope}, as of {now.isoformat()}: buckets ended before {(now - retention.buckets).isoformat()}, "
        f"the rest before {(now - retention.summaries).isoformat()}"
    )
    width = max(len(t) for t in result.deleted)
    print(f"{'TABLE':<{width}}  {verb.upper()}")
    for table, n in result.deleted.items():
        print(f"{table:<{width}}  {n}")
    print(f"{'total':<{width}}  {result.total}")
    return 0


def clusters_in(store: "Store") -> list[str]:
    """The cluster names the store's jobs carry, sorted."""
    import sqlalchemy as sa

    from auditor.store.tables import JOBS

    with store.reading("list the store's clusters") as conn:
        return sorted(conn.execute(sa.select(JOBS.c.cluster).distinct()).scalars())


def store_cluster(
    store: "Store", given: str | None, settings: "Settings", *, held: Callable[[], list[str]], also: str = ""
) -> str:
    """The cluster a command acts on: ``--cluster``; else the settings' where they name one (the
    operator's); else the one cluster the store holds (``held``: its jobs' clusters for a prune, its
    lineages' for an ack): the demo's store says ``demo``, and an admin trying ``ack`` on it should
    not get "known: none" for ``default`` (issue 30). A store of several clusters and no choice is
    refused, naming them (exit 2); an empty one gets the settings' (``default``), for the command
    to say it holds nothing there."""
    if given:
        return given
    if "cluster" in settings.model_fields_set:
        return settings.cluster
    clusters = held()
    if len(clusters) == 1:
        return clusters[0]
    if not clusters:
        return settings.cluster
    other = f" (or {also})" if also else ""
    raise BadInput(
        f"store {store.display_url} holds clusters {', '.join(clusters)}: pass --cluster NAME{other}, "
        "or set cluster in the settings"
    )
