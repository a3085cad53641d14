"""Backtest: replay policies over stored summaries and buckets, with no side effect.

For each stored job summary in the range, each policy is evaluated as of the job's end (the
sustained conditions read the stored buckets). A job that fires is assumed to open its violation
at its start plus the policy's warm-up and sustained duration (the earliest time the sustained
condition could have held), and the escalation ladder is walked with its ``after``/``cooldown``
delays until the job's end. Each step lands on a day; alerts (notify) and requeues are counted
per day. Exemptions by annotation and snoozes are not known to history and are ignored.

A job a policy does not fire on, whose verdict the policy takes, and that failed exactly one of its
conditions (a summary condition, ``lineage``, ``sustained`` or the ``gpus`` quorum) is a *near
miss*: listed with that condition, the job's value and the threshold, most GPU-hours lost first,
so that an admin sees which jobs a threshold lets through and by how much (issue 30).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any, Sequence

from auditor.core.gate import LineageHistory, replay
from auditor.core.job_summary import JobSummary, lost_gpu_hours
from auditor.policy.evaluate import evaluate
from auditor.policy.record import lineage_best
from auditor.policy.schema import ActionKind, GatePolicy, Policy


def walk_ladder(policy: Policy, opened: datetime, end: datetime) -> list[tuple[datetime, list[str]]]:
    """The steps that would have run between ``opened`` and ``end``, with their times."""
    out = []
    last: datetime | None = None
    for step in policy.spec.escalation:
        t = opened + step.after
        if last is not None:
            t = max(t, last + step.cooldown)
        if t > end:
            break
        out.append((t, [a.value for a in step.actions]))
        last = t
    return out


def simulate(store: Any, policies: Sequence[Policy], *, since: datetime, until: datetime) -> dict:
    """Which jobs each policy would have hit, with which actions, and alerts/requeues per day."""
    summaries = store.summaries(since=since, until=until)
    result: dict[str, Any] = {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "jobs": len(summaries),
        "policies": {},
    }
    for p in policies:
        result["policies"][p.name] = {
            "mode": p.spec.mode.value,
            "hits": [],
            "near_misses": [],
            "alerts": 0,
            "requeues": 0,
            "per_day": defaultdict(lambda: {"alerts": 0, "requeues": 0, "hits": 0}),
        }
    # the lineage condition's history, as the runner reads it: one batched read, each job against
    # the runs of its lineage that started before it
    best = (
        lineage_best(store if hasattr(store, "lineage_best_mfu") else None, summaries)
        if any(p.spec.lineage for p in policies)
        else {}
    )
    for doc in summaries:
        s = JobSummary.from_json(doc, "stored summary")
        end, start = s.end, s.start
        buckets = None
        if any(p.spec.sustained for p in policies):
            key = s.key
            found = store.find_job(key.namespace, key.kind, key.name, key.cluster)
            buckets = store.buckets(found[0]) if found else None
        for p in policies:
            ev = evaluate(p, s, now=end, buckets=buckets, lineage_best=best.get(str(s.key)), all_misses=True)
            if not ev.fires:
                miss = ev.near_miss
                if miss is not None:
                    lost = lost_gpu_hours(s)
                    near = {"job": str(s.key), **miss.to_json(), "lost_gpu_hours": lost}
                    result["policies"][p.name]["near_misses"].append(near)
                continue
            opened = start + (
                (p.spec.sustained.warmup + p.spec.sustained.duration) if p.spec.sustained else timedelta(0)
            )
            steps = walk_ladder(p, min(opened, end), end)
            pol = result["policies"][p.name]
            acts = [a for _, names in steps for a in names]
            if p.spec.mode.value == "warn":
                acts = [a for a in acts if a != ActionKind.REQUEUE.value]
            elif p.spec.mode.value == "audit":
                acts = []
            job = str(s.key)
            pol["hits"].append({"job": job, "reason": ev.reason, "actions": acts, "opened": opened.isoformat()})
            pol["per_day"][min(opened, end).date().isoformat()]["hits"] += 1
            for t, names in steps:
                day = pol["per_day"][t.date().isoformat()]
                if ActionKind.NOTIFY.value in names and p.spec.mode.value != "audit":
                    pol["alerts"] += 1
                    day["alerts"] += 1
                if ActionKind.REQUEUE.value in names and p.spec.mode.value == "enforce":
                    pol["requeues"] += 1
                    day["requeues"] += 1
    for pol in result["policies"].values():
        pol["per_day"] = dict(pol["per_day"])
        pol["near_misses"].sort(key=lambda n: (-(n["lost_gpu_hours"] or 0.0), n["job"]))
    return result


def simulate_gate(
    histories: Sequence[LineageHistory], policies: Sequence[GatePolicy], *, since: datetime, until: datetime
) -> dict[str, Any]:
    """What each gate rule would have done (in ``enforce``) to the submissions of ``[since, until)``.

    Every stored run of every lineage is replayed as a submission (:func:`auditor.core.gate.replay`:
    decided on the runs before it and the acknowledgements made by then); the rule that decided
    is credited with it. Runs submitted before ``since`` still weigh on later ones.
    """
    rules = [p.rule() for p in policies]
    out: dict[str, Any] = {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "lineages": len(histories),
        "submissions": 0,
        "rules": {
            r.name: {"action": r.action.value, "describe": r.describe(), "hits": [], "per_day": defaultdict(int)}
            for r in rules
        },
    }
    for h in histories:
        for step in replay(h, rules, since=since):
            when = step.run.when
            if when is None or when >= until:
                continue
            out["submissions"] += 1
            d = step.decision
            if d.rule is None:
                continue
            rule = out["rules"][d.rule]
            rule["hits"].append(
                {
                    "lineage": f"{h.key.cluster}/{h.key}",
                    "job": step.run.job,
                    "submitted": when.isoformat(),
                    "action": d.action.value,
                    "reason": d.reason,
                    "evidence": list(d.evidence),
                }
            )
            rule["per_day"][when.date().isoformat()] += 1
    for rule in out["rules"].values():
        rule["per_day"] = dict(rule["per_day"])
    return out
