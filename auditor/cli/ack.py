"""``gpu-auditor ack NAMESPACE/LINEAGE [--until T] [--reason R]``: acknowledge a held or flagged lineage.

The efficiency gate holds (or, in observe mode, would hold) a lineage's re-submissions when its
runs broke a gate rule; acknowledging says "I know, I fixed it": the runs so far no longer count,
the gate releases the held submissions, and new runs are judged afresh. The acknowledgement is
recorded in the store with who made it — the Kubernetes user (SelfSubjectReview) when a
kubeconfig or the in-cluster account is given, else the OS user — when, until when and why, and
``explain`` and the report show it. ``--snooze`` instead admits every submission until ``--until``.

Given a job, ``NAMESPACE/KIND/NAME --snooze --until T`` pauses that running job's escalation
instead (issue 30, what the alert's "Snooze this job's escalation" button does): its policies take
no step until then (no alert again, no annotation, Event or requeue), and acknowledge nothing for
the gate.
"""

from __future__ import annotations

import argparse
import getpass
import json
from datetime import datetime
from typing import TYPE_CHECKING

from auditor.cli.names import cluster_name
from auditor.cli.output import add_output_flag
from auditor.cli.storeopts import add_store_flags
from auditor.errors import BadInput
from auditor.render.safe_text import terminal_safe
from auditor.timeparse import format_time, parse_duration, parse_time

if TYPE_CHECKING:  # imported where used: every subcommand imports this module for --help
    from auditor.core.gate import LineageHistory
    from auditor.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ack",
        help="acknowledge a held or flagged lineage (the efficiency gate releases it)",
        description=__doc__.split("\n\n", 1)[1].replace("``", "") if __doc__ else None,
    )
    p.add_argument(
        "lineage",
        metavar="NAMESPACE/LINEAGE",
        help="the lineage, as the gate's message names it; or NAMESPACE/KIND/NAME with --snooze: "
        "pause that running job's escalation",
    )
    p.add_argument(
        "--until",
        metavar="T",
        help="when the acknowledgement ends: RFC 3339, now+DURATION, or a duration (7d); default: no end",
    )
    p.add_argument("--reason", default="", help="why (recorded and shown with the acknowledgement)")
    p.add_argument("--snooze", action="store_true", help="admit every submission until --until (needs --until)")
    p.add_argument(
        "--cluster",
        type=cluster_name,
        help="the cluster the lineage runs in (default: the settings' cluster where they set one, "
        "else the one cluster the store holds)",
    )
    p.add_argument("--by", help="record this name instead of the Kubernetes or OS user")
    kube = p.add_mutually_exclusive_group()
    kube.add_argument("--kubeconfig", metavar="PATH", help="ask this cluster who you are (recorded as kube:NAME)")
    kube.add_argument("--in-cluster", action="store_true", help="the pod's service account (recorded as kube:NAME)")
    add_store_flags(p)
    add_output_flag(p, "the acknowledgement", ("text", "json"))
    p.set_defaults(handler=ack)


def parse_until(text: str | None, now: datetime) -> datetime | None:
    """``--until``: a time (RFC 3339, ``now+7d``) or a duration from now (``7d``); None for no end."""
    if text is None:
        return None
    t = text.strip()
    if t and t[0].isdigit() and not any(c in t for c in "T:-"):
        until = now + parse_duration(t, what="--until")
    else:
        until = parse_time(t, now, what="--until")
    # whole seconds: a relative --until (``2d``) would otherwise print and store now's milliseconds,
    # and the same time read back elsewhere at seconds (issue 30: one precision)
    return until.replace(microsecond=0)


def who(args: argparse.Namespace, settings: "Settings") -> str:
    """The name recorded as ``by``: ``--by``, else ``kube:<user>`` when the command may ask the API, else ``os:<user>``."""
    if args.by:
        return str(args.by).strip()
    if args.kubeconfig or args.in_cluster:
        from auditor import compose

        return f"kube:{compose.kube_username(settings)}"
    return f"os:{getpass.getuser()}"


def ack(args: argparse.Namespace) -> int:
    from auditor import compose
    from auditor.cli.store import store_cluster
    from auditor.cli.storeopts import command_settings, open_store
    from auditor.core.gate import AckKind
    from auditor.core.lineage import LineageKey
    from auditor.store.lineage import AckLog, LineageHistoryReader

    overrides: dict = {}
    if args.kubeconfig or args.in_cluster:
        overrides["kubernetes"] = {"kubeconfig": args.kubeconfig, "in_cluster": bool(args.in_cluster)}
    settings = command_settings(args, overrides)
    now = compose.clock().now()
    if args.lineage.count("/") == 2:
        return _snooze_job(args, settings, now)
    # its spelling is checked before the store is opened: bad input is exit 2 whatever the store
    LineageKey.parse(args.lineage, cluster=args.cluster or settings.cluster, what="NAMESPACE/LINEAGE")
    until = parse_until(args.until, now)
    if until is not None and until <= now:
        raise BadInput(f"--until {args.until}: {format_time(until)} is not in the future")
    if args.snooze and until is None:
        raise BadInput("--snooze needs --until (a snooze admits everything, so it must end)")
    by = who(args, settings)
    store = open_store(settings, existing=True)
    try:
        reader = LineageHistoryReader(store)

        def held() -> list[str]:  # by default the one cluster whose lineages the store holds (the demo's)
            return sorted({s.key.cluster for s in reader.lineages()})

        key = LineageKey.parse(
            args.lineage, cluster=store_cluster(store, args.cluster, settings, held=held), what="NAMESPACE/LINEAGE"
        )
        known = reader.lineages(cluster=key.cluster, namespace=key.namespace)
        if not any(s.key == key for s in known):
            names = ", ".join(s.key.lineage for s in known[:10]) or "none"
            # the lineage under another cluster name (the demo's store says `demo`, the settings
            # `default`): say the --cluster that finds it rather than "known: none"
            elsewhere = sorted(
                {s.key.cluster for s in reader.lineages(namespace=key.namespace) if s.key.lineage == key.lineage}
            )
            hint = f"; it is in cluster {', '.join(elsewhere)}: pass --cluster {elsewhere[0]}" if elsewhere else ""
            raise BadInput(
                f"no lineage {key} in cluster {key.cluster} of store {store.display_url} (known: {names}){hint}"
            )
        kind = AckKind.SNOOZE if args.snooze else AckKind.ACK
        recorded = AckLog(store).acknowledge(key, by, until, args.reason, now, via="cli", kind=kind)
        decision = _decision_now(settings, reader.history(key, now), now)
    finally:
        store.close()
    doc = {
        "cluster": key.cluster,
        "lineage": str(key),
        "kind": recorded.kind.value,
        "by": recorded.by,
        "at": format_time(recorded.at),
        "until": format_time(recorded.until) if recorded.until else None,
        "reason": recorded.reason,
        "gate": decision,
    }
    if args.output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    what = "snoozed" if args.snooze else "acknowledged"
    end = f" until {doc['until']}" if doc["until"] else " (no end)"
    print(
        terminal_safe(
            f"{what} {key} (cluster {key.cluster}){end} as {recorded.by}"
            + (f": {recorded.reason}" if recorded.reason else "")
        )
    )
    if decision is not None:
        print(terminal_safe(f"the gate now: {decision['action']} — {decision['reason']}"))
    return 0


def _snooze_job(args: argparse.Namespace, settings: "Settings", now: datetime) -> int:
    """``ack NAMESPACE/KIND/NAME --snooze --until T``: pause a stored job's escalation ladder
    (recorded in the store's job snoozes, ``via`` cli), as the alert's snooze button does."""
    from auditor.cli.explain import parse_ref
    from auditor.cli.store import clusters_in, store_cluster
    from auditor.cli.storeopts import open_store
    from auditor.core.identity import JobKey

    namespace, kind, name = parse_ref(args.lineage)
    if not args.snooze:
        raise BadInput(
            f"{args.lineage} is a job: pass --snooze --until T to pause its escalation; to acknowledge "
            "for the gate, give its lineage (NAMESPACE/LINEAGE)"
        )
    until = parse_until(args.until, now)
    if until is None:
        raise BadInput("--snooze needs --until (a paused escalation must resume)")
    if until <= now:
        raise BadInput(f"--until {args.until}: {format_time(until)} is not in the future")
    by = who(args, settings)
    store = open_store(settings, existing=True)
    try:
        cluster = store_cluster(store, args.cluster, settings, held=lambda: clusters_in(store))
        if store.find_job(namespace, kind, name, cluster) is None:
            raise BadInput(
                f"no audited job {namespace}/{kind}/{name} in cluster {cluster} of store {store.display_url}"
            )
        job = JobKey(cluster, namespace, kind, name)
        recorded = store.job_snoozes().snooze(job, by, until, args.reason, now, via="cli")
    finally:
        store.close()
    doc = {"cluster": cluster, **recorded.to_json()}
    if args.output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    print(terminal_safe(f"escalation of {doc['job']} (cluster {cluster}) {recorded.text()}"))
    return 0


def gate_rules(settings: "Settings") -> list:
    """The gate's rules, from the settings' policy files (as the operator loads them)."""
    from auditor.operator_loop.policies import policy_files
    from auditor.policy.loader import PolicyRegistry

    registry = PolicyRegistry()
    registry.update(policy_files(settings))
    return [g.rule() for g in registry.gate_policies]


def _decision_now(settings: "Settings", history: "LineageHistory", now: datetime) -> dict | None:
    """What the gate (its rules from the settings' policy files, in its mode) decides now; None without rules."""
    from auditor.core.gate import decide

    rules = gate_rules(settings)
    if not rules:
        return None
    return decide(history, rules, settings.gate.mode, now).to_json()
