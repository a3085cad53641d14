"""``gpu-auditor status``: what the operator is doing, from its store alone.

The last cycle (when, how long, its outcome), the jobs flagged now (seen in the last hour with a
wasteful verdict) by team, the open policy violations, the actions of the last ``--since``
(7 days) by outcome with the alerts that went nowhere (no destination for the team), the
acknowledgements in force, the lineages the gate holds (its rules over the stored lineage
histories) and the weekly report deliveries that failed. The same figures the
operator exports on ``/metrics`` (docs/operator.md).

Exit codes: 0 when the last cycle succeeded and nothing failed; 1 when the last cycle failed,
a delivery or action failed, or the store has no cycle yet; 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta
from typing import Any

from auditor.cli.names import cluster_name
from auditor.cli.output import add_output_flag, dump_yaml
from auditor.cli.storeopts import add_store_flags

RECENT = timedelta(hours=1)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "status",
        help="what the operator is doing: last cycle, jobs flagged now, violations, actions, deliveries",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--since", default="7d", metavar="T", help="actions and deliveries from this time on (default 7d)")
    p.add_argument(
        "--cluster", type=cluster_name, metavar="NAME", help="only this cluster, where several share one store"
    )
    add_output_flag(p, "the status", ("table", "json", "yaml"))
    add_store_flags(p)
    p.set_defaults(handler=run)


def _t(t: datetime | None) -> str | None:
    return t.replace(microsecond=0).isoformat().replace("+00:00", "Z") if t is not None else None


def as_dict(st: Any, now: datetime, since: datetime) -> dict:
    """The status as JSON-ready data (the ``-o json`` document). A team's figures follow
    auditor/core/figures.py (docs/figures.md): waste counts flagged jobs only, a healthy job's
    idle-SM share is headroom, efficiency is the SM activity of the jobs with SM data."""
    from auditor.core.figures import Figures

    run = st.last_run
    sums: dict[str, Figures] = {}
    verdicts: dict[str, dict[str, int]] = {}
    measured_any: dict[str, bool] = {}
    for (team, verdict), (n, hours, waste, with_sm) in sorted(st.jobs.items()):
        sums.setdefault(team, Figures()).add(
            verdict, jobs=n, gpu_hours=hours, measured_gpu_hours=with_sm, idle_gpu_hours=waste
        )
        verdicts.setdefault(team, {})[verdict] = n
        measured_any[team] = measured_any.get(team, False) or waste is not None
    teams = {
        team: {
            "jobs": f.jobs,
            "flagged": f.flagged,
            "gpu_hours": round(f.gpu_hours, 2),
            # missing is never 0: no job of the team with SM data, no waste figure
            "waste_gpu_hours": round(f.waste_gpu_hours, 2) if measured_any[team] else None,
            "headroom_gpu_hours": round(f.headroom_gpu_hours, 2) if measured_any[team] else None,
            # six digits: the text prints one decimal of a percent from it, as the console does
            # (rounding to four first read 13.2 % here for the console's 13.3 %)
            "efficiency": None if f.efficiency is None else round(f.efficiency, 6),
            "verdicts": verdicts[team],
        }
        for team, f in sums.items()
    }
    return {
        "now": _t(now),
        "since": _t(since),
        "last_cycle": None
        if run is None
        else {
            "started": _t(run["started"]),
            "finished": _t(run["finished"]),
            "seconds": round((run["finished"] - run["started"]).total_seconds(), 1),
            "status": run["status"],
            "jobs": run["jobs"],
            "error": (run.get("detail") or {}).get("error"),
        },
        "window": {"seen_since": _t(now - RECENT), "until": _t(now)},
        "flagged_now": st.flagged_jobs,
        "teams": teams,
        "open_violations": [
            {"namespace": ns, "policy": p, "count": n} for (ns, p), n in sorted(st.open_violations.items())
        ],
        "actions": [{"action": a, "state": s, "count": n} for (a, s), n in sorted(st.actions.items())],
        "undelivered_alerts": [
            {"namespace": ns, "why": w, "count": n} for (ns, w), n in sorted(st.undelivered.items())
        ],
        "acknowledgements_in_force": dict(sorted(st.acks_active.items())),
        "report_deliveries": [{"channel": c, "status": s, "count": n} for (c, s), n in sorted(st.deliveries.items())],
    }


#: lineages whose last run is older than this are not judged (the gate's rules look back days)
LINEAGE_LOOKBACK = timedelta(days=30)


def held_lineages(store: Any, settings: Any, now: datetime, *, cluster: str | None) -> dict:
    """The lineages the gate holds (enforce) or would hold (observe) now: its rules from the
    settings' policy files over the store's lineage histories and acknowledgements — what the
    gate would answer for a new submission of each, the same decision ``ack`` prints."""
    from auditor.cli.ack import gate_rules
    from auditor.core.gate import GateAction, decide
    from auditor.store.lineage import LineageHistoryReader

    rules = gate_rules(settings)
    out: dict = {"mode": str(settings.gate.mode), "rules": len(rules), "held": [], "deprioritized": 0}
    if not rules:
        return out
    for h in LineageHistoryReader(store).histories(cluster=cluster, since=now - LINEAGE_LOOKBACK):
        d = decide(h, rules, settings.gate.mode, now)
        if d.would is GateAction.HOLD:
            out["held"].append({"lineage": f"{h.key.namespace}/{h.key.lineage}", "rule": d.rule, "reason": d.reason})
        elif d.would is GateAction.DEPRIORITIZE:
            out["deprioritized"] += 1
    return out


def failing(doc: dict) -> list[str]:
    """Why ``status`` exits 1 (empty: all is well)."""
    why = []
    run = doc["last_cycle"]
    if run is None:
        why.append("no cycle recorded in this store yet")
    elif run["status"] != "ok":
        why.append(f"the last cycle {run['status']}" + (f": {run['error']}" if run["error"] else ""))
    failed = sum(a["count"] for a in doc["actions"] if a["state"] == "failed")
    if failed:
        why.append(f"{failed} action(s) failed")
    failed = sum(d["count"] for d in doc["report_deliveries"] if d["status"] == "failed")
    if failed:
        why.append(f"{failed} report delivery(ies) failed")
    return why


def text(doc: dict) -> str:
    """The status for a terminal: short sections, each line under 120 columns."""
    from auditor.render.safe_text import terminal_safe as safe

    out = []
    run = doc["last_cycle"]
    if run is None:
        out.append("last cycle: none recorded")
    else:
        out.append(
            f"last cycle: {run['finished']} ({run['seconds']} s, {run['status']}, {run['jobs']} jobs)"
            + (f": {safe(run['error'], 60)}" if run["error"] else "")
        )
    w = doc["window"]
    out.append(
        f"jobs flagged now: {doc['flagged_now']} (seen since {w['seen_since']}, the last hour, with a wasteful verdict)"
    )
    if doc["teams"]:
        out.append(
            f"  {'TEAM':<24} {'JOBS':>5} {'FLAGGED':>7} {'GPU-H':>9} {'WASTE-H':>9} {'HEADROOM-H':>10} {'EFFIC':>6}"
        )
        for team, t in sorted(doc["teams"].items(), key=lambda kv: -(kv[1]["waste_gpu_hours"] or 0.0)):
            waste = "-" if t["waste_gpu_hours"] is None else f"{t['waste_gpu_hours']:.2f}"
            room = "-" if t["headroom_gpu_hours"] is None else f"{t['headroom_gpu_hours']:.2f}"
            eff = "-" if t["efficiency"] is None else f"{100 * t['efficiency']:.1f}%"
            out.append(
                f"  {safe(team or '-', 24):<24} {t['jobs']:>5} {t['flagged']:>7} {t['gpu_hours']:>9.2f} {waste:>9}"
                f" {room:>10} {eff:>6}"
            )
        out.append("  (waste: flagged jobs' idle-SM GPU-hours; headroom: healthy jobs'; efficiency: SM activity)")
    n = sum(v["count"] for v in doc["open_violations"])
    out.append(f"open violations: {n}")
    for v in doc["open_violations"]:
        out.append(f"  {safe(v['namespace'], 40):<40} {safe(v['policy'], 40):<40} {v['count']:>5}")
    acts = ", ".join(f"{a['action']} {a['state']} {a['count']}" for a in doc["actions"]) or "none"
    out.append(f"actions since {doc['since']}: {acts}")
    und = sum(u["count"] for u in doc["undelivered_alerts"])
    out.append(f"alerts not delivered: {und}")
    for u in doc["undelivered_alerts"]:
        out.append(f"  {safe(u['namespace'], 24):<24} {u['count']:>4}  {safe(u['why'], 86)}")
    g = doc.get("gate") or {}
    if g.get("rules"):
        verb = "held" if g["mode"] == "enforce" else "would be held (observe mode)"
        out.append(f"lineages {verb}: {len(g['held'])}; deprioritized: {g['deprioritized']}")
        for h in g["held"][:20]:
            out.append(f"  {safe(h['lineage'], 48):<48} {safe(h['reason'], 68)}")
    else:
        out.append("lineages held: none (no gate rules in the policy files)")
    acks = ", ".join(f"{k} {n}" for k, n in doc["acknowledgements_in_force"].items()) or "none"
    out.append(f"acknowledgements in force: {acks}")
    for s in doc.get("escalations_snoozed") or ():  # issue 30: the ladders their owners paused
        out.append(f"escalation snoozed: {safe(s['job'], 60)} until {s['until']} by {safe(s['by'], 40)}")
    dels = ", ".join(f"{d['channel']} {d['status']} {d['count']}" for d in doc["report_deliveries"]) or "none"
    out.append(f"report deliveries since {doc['since']}: {dels}")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    from auditor import compose
    from auditor.cli.actions import since_time
    from auditor.cli.storeopts import command_settings, open_store
    from auditor.errors import BadInput
    from auditor.store.status_queries import operator_status

    now = compose.clock().now()
    since = since_time(args.since, now)
    if since > now:
        raise BadInput(f"--since {args.since}: in the future")
    settings = command_settings(args)
    store = open_store(settings, read_only=True)  # status only reads: a read-only store is enough
    try:
        st = operator_status(store, now=now, since=since, recent_since=now - RECENT, cluster=args.cluster)
        held = held_lineages(store, settings, now, cluster=args.cluster)
        snoozed = store.job_snoozes().in_force(now, cluster=args.cluster)  # issue 30
    finally:
        store.close()
    doc = as_dict(st, now, since)
    doc["gate"] = held
    doc["escalations_snoozed"] = [s.to_json() for _, s in sorted(snoozed.items())]
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    elif args.output == "yaml":
        sys.stdout.write(dump_yaml(doc))
    else:
        print(text(doc))
    why = failing(doc)
    for w in why:
        print(f"status: {w}", file=sys.stderr)
    return 1 if why else 0
