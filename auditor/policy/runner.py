"""The policy runner: one call per operator cycle turns job summaries into decisions and actions.

``PolicyRunner.run_cycle(summaries, now=..., act=...)`` is the whole interface the operator
loop needs. Per job and policy it evaluates (pure, :mod:`auditor.policy.evaluate`), keeps the
violation's escalation state in the store, claims the due step under its dedup key, and only
then runs the step's actions (:mod:`auditor.actions`, :mod:`auditor.notify`). With ``act=False``
nothing is written anywhere: the decisions say what would happen.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from auditor.core.acklink import LinkIssuer
from auditor.core.lineage import lineage_of_summary
from auditor.core.model import Window
from auditor.errors import AuditorError, BadInput
from auditor.notify import SlackNotifier, WebhookNotifier
from auditor.notify.http import RetryPolicy
from auditor.notify.slack import context, fields, header, section, slack_escape
from auditor.policy.escalation import ViolationState, action_key, decision_key, due_step, job_key
from auditor.policy.evaluate import Evaluation, JobFacts, evaluate, parse_rfc3339
from auditor.policy.loader import PolicyRegistry
from auditor.policy.schema import ActionKind, Mode, Policy

if TYPE_CHECKING:
    from auditor.ports import ClusterActions

log = logging.getLogger(__name__)

#: read this much before a sustained window, so its first bucket is whole whatever the width
_READ_MARGIN = timedelta(hours=1)
#: ``reason`` of a notification recorded as skipped because its team has no destination
NO_DESTINATION = "no_destination"


@dataclass(frozen=True)
class Route:
    """Where a team's alerts go; any of the two may be unset."""

    slack_url: str | None = None
    webhook_url: str | None = None
    webhook_secret: str | None = None


@dataclass(frozen=True)
class RequeueSettings:
    """Requeue is off unless ``enabled`` and the job's namespace or queue is listed."""

    enabled: bool = False
    namespaces: frozenset[str] = frozenset()
    queues: frozenset[str] = frozenset()
    max_per_hour: int = 5  # cluster-wide

    def allows(self, summary: Mapping[str, Any]) -> str | None:
        """None when requeue is allowed for this job, else why not."""
        if not self.enabled:
            return "requeue is disabled (settings)"
        if summary.get("namespace") in self.namespaces or (
            summary.get("queue") and summary.get("queue") in self.queues
        ):
            return None
        return "requeue is not enabled for this namespace or queue"


@dataclass(frozen=True)
class RunnerConfig:
    cluster: str = "default"
    default_route: Route = Route()
    routes: Mapping[str, Route] = field(default_factory=dict)  # team → route
    requeue: RequeueSettings = RequeueSettings()
    retry: RetryPolicy = RetryPolicy()
    #: a claimed action not finished after this long was interrupted (crash): resume it
    stale_claim_after: timedelta = timedelta(minutes=10)
    instance: str = "gpu-auditor"
    #: action kinds turned off by the installation (the chart then grants no RBAC for them)
    disabled_actions: frozenset[ActionKind] = frozenset()
    #: signed acknowledgement links for the alerts (settings gate.ack_link_*); None: alerts carry none
    ack_links: LinkIssuer | None = None


@dataclass
class Decision:
    """One policy's outcome on one job in one cycle (JSON-ready through :meth:`as_dict`)."""

    policy: str
    mode: str
    job: str  # cluster/namespace/Kind/name
    verdict: str | None
    reason: str
    evidence: dict
    step: int | None = None
    actions: list[str] = field(default_factory=list)
    dry_run: bool = True
    blocked: str | None = None
    dedup_key: str | None = None
    results: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "policy": self.policy,
            "mode": self.mode,
            "job": self.job,
            "verdict": self.verdict,
            "reason": self.reason,
            "step": self.step,
            "actions": self.actions,
            "dry_run": self.dry_run,
            "blocked": self.blocked,
            "dedup_key": self.dedup_key,
            "results": self.results,
            "evidence": self.evidence,
        }


def _ref(summary: Mapping[str, Any]) -> dict:
    """The parts of a summary an action needs later (stored with the decision, for resumes)."""
    return {k: summary.get(k) for k in ("cluster", "namespace", "job", "uid", "team", "queue", "pods", "verdict")}


class PolicyRunner:
    """Evaluate policies each cycle and (with ``act``) carry out their escalation.

    Args:
        policies: a :class:`PolicyRegistry` (hot-reloaded by its owner), or a fixed list.
        store: the :class:`~auditor.store.Store`; required to act (it holds the dedup keys)
            and for ``sustained`` conditions (they read the stored buckets).
        kube: the cluster actions port (:class:`~auditor.ports.ClusterActions`; the operator's is
            :class:`~auditor.actions.KubeActions`), or None (no Kubernetes: annotate, event and
            requeue are recorded as skipped; label selectors and opt-out annotations match nothing).
        config: routing, requeue settings, retry policy of the notifiers.
    """

    def __init__(
        self,
        policies: PolicyRegistry | Sequence[Policy],
        store: Any | None = None,
        kube: "ClusterActions | None" = None,
        config: RunnerConfig | None = None,
        *,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self._policies = policies
        self.store = store
        self.kube = kube
        self.config = config or RunnerConfig()
        self._sleep = sleep
        #: teams already warned about having no alert destination (once per team and process)
        self._unrouted: set[str] = set()
        self._repo = None
        if store is not None:
            from auditor.store.decisions import DecisionStore

            self._repo = DecisionStore(store)

    @property
    def policies(self) -> list[Policy]:
        p = self._policies
        return list(p.policies) if isinstance(p, PolicyRegistry) else list(p)

    # ------------------------------------------------------------------ the cycle

    def run_cycle(self, summaries: list[dict], *, now: datetime, act: bool) -> list[Decision]:
        """Evaluate every policy on every summary; with ``act``, run the due escalation steps.

        Returns one :class:`Decision` per (job, policy) that fired (including those blocked by a
        snooze or still waiting for a cooldown: ``step`` is None then), plus the requeue
        reactivations that came due. Never raises for one job's failure: the error is recorded
        in that decision's ``results``.
        """
        if act and self._repo is None:
            raise BadInput("acting on policies needs a store (it keeps the dedup keys)")
        policies = self.policies
        out: list[Decision] = []
        if act:
            out += self._resume(now)
        for summary in summaries:
            if summary.get("cluster") in (None, ""):
                summary = {**summary, "cluster": self.config.cluster}
            try:
                out += self._job(summary, policies, now=now, act=act)
            except AuditorError as exc:
                log.warning("policies on %s: %s", job_key(summary), exc)
                out.append(
                    Decision(
                        "*",
                        "-",
                        job_key(summary),
                        summary.get("verdict"),
                        f"error: {exc}",
                        {},
                        results={"error": str(exc)},
                    )
                )
        return out

    def _job(self, summary: dict, policies: list[Policy], *, now: datetime, act: bool) -> list[Decision]:
        from auditor.store.decisions import JobIdent

        verdict = summary.get("verdict")
        if verdict in (None, "insufficient_data") or not policies:
            return []  # nothing happens on insufficient data: not even closing a violation
        facts = JobFacts()
        # Kubernetes is asked only when some policy can fire on this verdict (two GETs per job)
        if self.kube is not None and any(not p.spec.verdicts or verdict in p.spec.verdicts for p in policies):
            facts = self.kube.facts(summary)
        buckets = None
        if any(p.spec.sustained for p in policies):
            buckets = self._buckets(summary, policies, now)
        job = JobIdent.of(summary)
        decisions: list[Decision] = []
        for policy in policies:
            ev = evaluate(policy, summary, now=now, facts=facts, buckets=buckets)
            if ev.exempt:
                continue
            if not ev.fires:
                if ev.judged and act and self._repo is not None:
                    if self._repo.close_violation(job, policy.name, now):
                        log.info("%s: %s no longer fires; violation closed", job_key(summary), policy.name)
                continue
            decisions.append(self._step(policy, summary, ev, job, now=now, act=act))
        return decisions

    def _buckets(self, summary: dict, policies: list[Policy], now: datetime) -> list | None:
        if self.store is None:
            return None
        kind, _, name = str(summary.get("job") or "").partition("/")
        found = self.store.find_job(str(summary.get("namespace")), kind, name, summary.get("cluster"))
        if found is None:
            return None
        longest = max(p.spec.sustained.duration for p in policies if p.spec.sustained)
        # only the trailing windows, which end at the job's last bucket: the warm-up is judged
        # from the summary's start, so the read (by job and time, indexed) costs the same for a
        # job of an hour and one of a month
        end = parse_rfc3339(str(summary.get("end") or ""))
        if end is None:  # not an audit-JSON summary: all of the job's buckets
            return self.store.buckets(found[0])
        last = min(now, end)
        return self.store.buckets(found[0], Window(last - longest - _READ_MARGIN, now + timedelta(seconds=1)))

    def _step(self, policy: Policy, summary: dict, ev: Evaluation, job: Any, *, now: datetime, act: bool) -> Decision:
        mode = policy.spec.mode
        d = Decision(
            policy.name,
            mode.value,
            job_key(summary),
            summary.get("verdict"),
            ev.reason,
            ev.evidence,
            blocked=ev.blocked,
        )
        repo = self._repo
        if repo is not None:
            open_ = repo.open_violations(job, policy.name)
            state = open_[0][2] if open_ else None
        else:
            state = None
        if ev.snoozed:
            return d
        if state is None:
            if not act:
                state = ViolationState(None, 1, now, 0, None)
            else:
                state = repo.open_violation(job, policy.name, now, ev.evidence, summary.get("uid"))  # type: ignore[union-attr]
        due = due_step(policy, state, now)
        if due is None:
            return d
        idx, step = due
        d.step, d.actions = idx, [a.value for a in step.actions]
        d.dedup_key = decision_key(summary, policy.name, state.episode, idx)
        d.dry_run = not act or mode is Mode.AUDIT
        if ActionKind.REQUEUE in step.actions and mode is Mode.ENFORCE and act:
            why = self._requeue_blocked(policy, summary, job, now)
            if why:
                d.results["requeue"] = {"state": "deferred", "why": why}
                if why.startswith("rate limit"):
                    d.blocked = why
                    return d  # not claimed: retried next cycle when the rate allows
        if not act:
            return d
        keys = [action_key(d.dedup_key, a) for a in d.actions]
        evidence = {**ev.evidence, "job_ref": _ref(summary), "policy_mode": mode.value}
        did = repo.claim_step(  # type: ignore[union-attr]
            job,
            policy.name,
            state,
            idx,
            dedup_key=d.dedup_key,
            mode=mode.value,
            action_names=d.actions,
            action_keys=keys,
            now=now,
            dry_run=d.dry_run,
            verdict=str(summary.get("verdict")),
            reason=ev.reason,
            evidence=evidence,
        )
        if did is None:
            d.results["claimed"] = False  # another replica or an earlier run took this step
            return d
        if d.dry_run:
            return d
        for action, key in zip(step.actions, keys):
            d.results[action.value] = self._run_action(action, key, policy, summary, ev.reason, ev.evidence, now)
        return d

    def _requeue_blocked(self, policy: Policy, summary: dict, job: Any, now: datetime) -> str | None:
        why = self.config.requeue.allows(summary)
        if why:
            return why
        assert self._repo is not None
        if self._repo.count_job_actions(job, "requeue") >= policy.spec.requeue.max_per_job:
            return f"cap of {policy.spec.requeue.max_per_job} requeue(s) per job reached"
        if (
            self._repo.count_actions("requeue", since=now - timedelta(hours=1), cluster=summary.get("cluster"))
            >= self.config.requeue.max_per_hour
        ):
            return f"rate limit: {self.config.requeue.max_per_hour} requeues per hour in the cluster"
        return None

    # ------------------------------------------------------------------ actions

    def _run_action(
        self, action: ActionKind, key: str, policy: Policy, summary: dict, reason: str, evidence: dict, now: datetime
    ) -> dict:
        from auditor.store.decisions import DONE, FAILED, SKIPPED

        repo = self._repo
        assert repo is not None
        try:
            if action is ActionKind.NOTIFY:
                result = self._notify(policy, summary, reason, evidence, key, now)
                state = DONE if result.get("ok") else (SKIPPED if result.get("skipped") else FAILED)
                repo.finish_action(key, state, now, result=result, error=result.get("error"))
                return {"state": state, **result}
            if self.kube is None:
                repo.finish_action(key, SKIPPED, now, result={"why": "no Kubernetes access"})
                return {"state": SKIPPED, "why": "no Kubernetes access"}
            if action in self.config.disabled_actions:
                why = f"{action.value} is turned off in this installation (features)"
                repo.finish_action(key, SKIPPED, now, result={"why": why})
                return {"state": SKIPPED, "why": why}
            if action is ActionKind.ANNOTATE:
                result = self.kube.annotate(summary, self._annotations(policy, summary, reason, now))
                repo.finish_action(key, DONE, now, result=result)
                return {"state": DONE, **result}
            if action is ActionKind.EVENT:
                note = f"gpu-auditor policy {policy.name}: {reason}." + (
                    f" Advice: {policy.spec.advice}" if policy.spec.advice else ""
                )
                result = self.kube.event(
                    summary, key=key, reason="GpuPolicyViolation", note=note, action=f"policy/{policy.name}", now=now
                )
                repo.finish_action(key, DONE, now, result=result)
                return {"state": DONE, **result}
            if action is ActionKind.REQUEUE:
                return self._requeue(key, policy, summary, reason, now)
        except AuditorError as exc:
            repo.finish_action(key, FAILED, now, error=str(exc))
            return {"state": FAILED, "error": str(exc)}
        raise AssertionError(action)  # pragma: no cover

    def _annotations(self, policy: Policy, summary: dict, reason: str, now: datetime) -> dict[str, Any]:
        def pct(v: Any) -> str:
            return f"{v * 100:.1f}%" if isinstance(v, (int, float)) else "n/a"

        return {
            "gpu-auditor.io/verdict": summary.get("verdict"),
            "gpu-auditor.io/policy": policy.name,
            "gpu-auditor.io/reason": reason,
            "gpu-auditor.io/gpu-util": pct(summary.get("gpu_util")),
            "gpu-auditor.io/sm-active": pct(summary.get("sm_active")),
            "gpu-auditor.io/waste-gpu-hours": f"{summary['waste_gpu_hours']:.2f}"
            if isinstance(summary.get("waste_gpu_hours"), (int, float))
            else "n/a",
            "gpu-auditor.io/decided-at": now.isoformat().replace("+00:00", "Z"),
        }

    def _route(self, team: str | None) -> Route:
        return self.config.routes.get(team or "", self.config.default_route)

    def _notify(self, policy: Policy, summary: dict, reason: str, evidence: dict, key: str, now: datetime) -> dict:
        route = self._route(summary.get("team"))
        if not route.slack_url and not route.webhook_url:
            return self._unrouted_alert(str(summary.get("team") or ""), policy)
        kw: dict[str, Any] = {"retry": self.config.retry}
        if self._sleep is not None:
            kw["sleep"] = self._sleep
        out: dict[str, Any] = {}
        lineage, ack_url = self._ack_link(summary, now)
        if route.slack_url:
            text, blocks = slack_message(policy, summary, reason, ack_url=ack_url, lineage=lineage)
            out["slack"] = SlackNotifier(route.slack_url, **kw).send(text, blocks).as_dict()
        if route.webhook_url:
            if not route.webhook_secret:
                out["webhook"] = {"ok": False, "error": "webhook has no signing secret"}
            else:
                payload = {
                    "policy": policy.name,
                    "mode": policy.spec.mode.value,
                    "job": _ref(summary),
                    "reason": reason,
                    "advice": policy.spec.advice,
                    "evidence": evidence,
                    "decided_at": now.isoformat().replace("+00:00", "Z"),
                    "dedup_key": key,
                }
                if ack_url:  # the job's lineage and the signed link, when links are configured
                    payload.update(lineage=lineage, ack_url=ack_url)
                import hashlib
                import uuid

                did = str(uuid.UUID(hashlib.sha256(key.encode()).hexdigest()[:32]))  # same id on a resume
                out["webhook"] = (
                    WebhookNotifier(route.webhook_url, route.webhook_secret, **kw)
                    .send("policy.violation", payload, delivery_id=did)
                    .as_dict()
                )
        out["ok"] = all(v.get("ok") for v in out.values() if isinstance(v, dict))
        errs = [str(v["error"]) for v in out.values() if isinstance(v, dict) and v.get("error")]
        if errs:
            out["error"] = "; ".join(errs)
        return out

    def _ack_link(self, summary: Mapping[str, Any], now: datetime) -> tuple[str, str | None]:
        """The job's lineage (``namespace/lineage``) and, with a link key configured, a fresh
        single-use link acknowledging it (sent to the job's team)."""
        key = lineage_of_summary(summary)
        if self.config.ack_links is None:
            return str(key), None
        import secrets

        to = f"team:{summary.get('team') or key.namespace}"
        return str(key), self.config.ack_links.issue(key, to, now, secrets.token_hex(12))

    def _unrouted_alert(self, team: str, policy: Policy) -> dict:
        """The result of an alert that has nowhere to go: recorded as skipped (``reason``
        :data:`NO_DESTINATION`, the operator counts it), and a warning the first time per team,
        since every later alert of that team is lost the same way until a route is configured."""
        why = (
            f"no destination for team {team or '(none)'}: set notifications.routes.{team or '<team>'} "
            "or a default notifications.slack / notifications.webhook"
        )
        if team not in self._unrouted:
            self._unrouted.add(team)
            log.warning(
                "policy %s: alerts of team %s are not delivered (%s); they are recorded as skipped",
                policy.name,
                team or "(none)",
                why,
            )
        return {"ok": False, "skipped": True, "reason": NO_DESTINATION, "team": team, "why": why}

    def _requeue(self, key: str, policy: Policy, summary: dict, reason: str, now: datetime) -> dict:
        from auditor.actions.kube import RequeueRefused
        from auditor.store.decisions import SKIPPED, WAITING

        repo = self._repo
        assert repo is not None and self.kube is not None
        if policy.spec.mode is not Mode.ENFORCE:
            repo.finish_action(key, SKIPPED, now, result={"why": f"mode {policy.spec.mode.value} never requeues"})
            return {"state": SKIPPED, "why": f"mode {policy.spec.mode.value} never requeues"}
        why = self.config.requeue.allows(summary)
        if (
            why is None
            and repo.count_job_actions(JobIdentOf(summary), "requeue", ("done", "waiting"))
            >= policy.spec.requeue.max_per_job
        ):
            why = "requeue cap per job reached"
        if why:
            repo.finish_action(key, SKIPPED, now, result={"why": why})
            return {"state": SKIPPED, "why": why}
        try:
            target = self.kube.requeue_target(summary)
        except RequeueRefused as exc:
            repo.finish_action(key, SKIPPED, now, result={"why": str(exc)})
            return {"state": SKIPPED, "why": str(exc)}
        result = self.kube.deactivate(target, lower_priority_by=policy.spec.requeue.lower_priority_by)
        due = now + policy.spec.requeue.backoff
        result["reactivate_at"] = due.isoformat()
        result["backoff_s"] = policy.spec.requeue.backoff.total_seconds()
        if not result.get("reserved"):
            # nothing held (a plain Job, or a Workload without quota): the backoff starts now
            result["quota_released_at"] = now.isoformat()
        repo.finish_action(key, WAITING, now, result=result, due_at=due)
        self.kube.annotate(
            {**summary, "pods": []},
            {
                "gpu-auditor.io/requeued-at": now.isoformat().replace("+00:00", "Z"),
                "gpu-auditor.io/requeue-reason": f"policy {policy.name}: {reason}",
                "gpu-auditor.io/reactivate-at": due.isoformat().replace("+00:00", "Z"),
            },
        )
        self.kube.event(
            summary,
            key=key + "#stop",
            reason="GpuAuditorRequeue",
            action="requeue",
            now=now,
            note=f"gpu-auditor stopped this job to requeue it (policy {policy.name}: {reason}); "
            f"it goes back to its queue after {policy.spec.requeue.backoff}. It restarts from its last checkpoint.",
        )
        return {"state": WAITING, **result}

    # ------------------------------------------------------------------ due work

    def _requeue_due(self, row: Any, now: datetime) -> tuple[datetime | None, dict]:
        """When a requeued job goes back to its queue, and the row's result as now known.

        The backoff counts from the release of the job's quota, as Kueue signals it
        (``QuotaReserved`` turning False once the evicted job has no active pods), first seen by
        a cycle; never earlier than our patch plus the backoff. A Workload that still holds its
        quota after twice the backoff goes back all the same, so a job that never stops is not
        held for ever. None: not due, and nothing to say yet (the Workload could not be read).
        """
        from auditor.store.decisions import WAITING

        repo = self._repo
        assert repo is not None and self.kube is not None and row.due_at is not None
        res = dict(row.result)
        if res.get("type") != "workload" or res.get("quota_released_at") or "backoff_s" not in res:
            return row.due_at, res
        backoff = timedelta(seconds=float(res["backoff_s"]))
        try:
            held = self.kube.holds_quota(res)
        except AuditorError as exc:
            log.warning(
                "requeue of %s/%s: cannot read its Workload (%s); trying again next cycle",
                res.get("namespace"),
                res.get("name"),
                exc,
            )
            return (row.due_at if now >= row.due_at + backoff else None), res
        if held:
            return (row.due_at if now >= row.due_at + backoff else None), res
        due = max(row.due_at, now + backoff)
        res.update(quota_released_at=now.isoformat(), reactivate_at=due.isoformat())
        repo.finish_action(row.dedup_key, WAITING, now, result=res, due_at=due)
        if due != row.due_at:
            self._show_reactivate_at(row, due)
        return due, res

    def _show_reactivate_at(self, row: Any, at: datetime) -> None:
        """Keep the job's ``gpu-auditor.io/reactivate-at`` true when the time moves (a late quota
        release, a cycle after the due time): users read it to know when their job goes back. A
        failed write is logged, never fatal: the store's row is what the operator acts on."""
        assert self.kube is not None
        try:
            self.kube.annotate(
                {"job": f"{row.job.kind}/{row.job.name}", "namespace": row.job.namespace, "pods": []},
                {"gpu-auditor.io/reactivate-at": at.isoformat().replace("+00:00", "Z")},
            )
        except AuditorError as exc:
            log.warning(
                "requeue of %s/%s: cannot update gpu-auditor.io/reactivate-at (%s)",
                row.job.namespace,
                row.job.name,
                exc,
            )

    def _resume(self, now: datetime) -> list[Decision]:
        """Reactivate requeued jobs whose backoff is over; finish steps a crash interrupted."""
        from auditor.store.decisions import DONE, FAILED, WAITING

        repo = self._repo
        assert repo is not None
        out: list[Decision] = []
        for row in repo.actions_in([WAITING], cluster=self.config.cluster, action="requeue"):
            if row.due_at is None or self.kube is None:
                continue
            due, result = self._requeue_due(row, now)
            if due is None or due > now:
                continue
            row = dataclasses.replace(row, result=result, due_at=due)
            if not repo.take_action(row.dedup_key, WAITING, "reactivating", now):
                continue  # another replica is on it
            key = f"{row.job.cluster}/{row.job.namespace}/{row.job.kind}/{row.job.name}"
            d = Decision(
                row.policy,
                "enforce",
                key,
                None,
                "requeue backoff over: reactivate",
                {},
                dry_run=False,
                dedup_key=row.dedup_key,
                actions=["reactivate"],
            )
            try:
                res = self.kube.reactivate(row.result)
                repo.finish_action(
                    row.dedup_key,
                    DONE,
                    now,
                    result={**row.result, "reactivated": res, "reactivated_at": now.isoformat()},
                )
                d.results["reactivate"] = {"state": DONE, **res}
                if now != due and not res.get("gone"):
                    self._show_reactivate_at(row, now)
            except AuditorError as exc:
                # put it back: the next cycle tries again (reactivation must not be lost)
                repo.finish_action(row.dedup_key, WAITING, now, result=row.result, error=str(exc), due_at=row.due_at)
                d.results["reactivate"] = {"state": "retry", "error": str(exc)}
            out.append(d)
        policies = {p.name: p for p in self.policies}
        for row in repo.stale_claims(now, self.config.stale_claim_after, cluster=self.config.cluster):
            decision = next((x for x in repo.decisions(job=row.job) if x["id"] == row.decision_id), None)
            policy = policies.get(row.policy)
            if decision is None or policy is None:
                repo.finish_action(row.dedup_key, FAILED, now, error="interrupted; policy gone")
                continue
            summary = dict(decision["evidence"].get("job_ref") or {})
            if row.action == ActionKind.NOTIFY.value:
                # at most once for people: a maybe-sent alert is not sent again
                repo.finish_action(
                    row.dedup_key, FAILED, now, error="interrupted before its result was recorded; not resent"
                )
                continue
            d = Decision(
                row.policy,
                policy.spec.mode.value,
                job_key(summary),
                summary.get("verdict"),
                "resumed after an interruption",
                {},
                dry_run=False,
                dedup_key=row.dedup_key,
                actions=[row.action],
            )
            d.results[row.action] = self._run_action(
                ActionKind(row.action), row.dedup_key, policy, summary, decision["reason"], decision["evidence"], now
            )
            out.append(d)
        return out


def JobIdentOf(summary: Mapping[str, Any]) -> Any:
    from auditor.store.decisions import JobIdent

    return JobIdent.of(dict(summary))


def slack_message(
    policy: Policy, summary: Mapping[str, Any], reason: str, *, ack_url: str | None = None, lineage: str | None = None
) -> tuple[str, list[dict]]:
    """The Slack alert for a violation; every user-controlled string goes through slack_escape.
    With ``ack_url`` (a signed link) it ends with a button that acknowledges the job's lineage."""

    def pct(v: Any) -> str:
        return f"{v * 100:.0f}%" if isinstance(v, (int, float)) else "n/a"

    job = f"{summary.get('namespace')}/{summary.get('job')}"
    text = f"gpu-auditor: {slack_escape(job)} breaks policy {slack_escape(policy.name)}"
    blocks = [
        header(f"GPU policy {policy.name}: {summary.get('verdict')}"),
        section(
            f"*Job* `{slack_escape(job)}` (team {slack_escape(summary.get('team'))}, "
            f"{slack_escape(summary.get('gpus'))} × {slack_escape(summary.get('gpu_model'))})\n{slack_escape(reason)}"
        ),
        fields(
            [
                ("GPU util", pct(summary.get("gpu_util"))),
                ("SM active", pct(summary.get("sm_active"))),
                ("Tensor active", pct(summary.get("tensor_active"))),
                (
                    "Wasted GPU-h",
                    summary.get("waste_gpu_hours") if summary.get("waste_gpu_hours") is not None else "n/a",
                ),
            ]
        ),
    ]
    if policy.spec.advice:
        blocks.append(section(f"*Advice:* {slack_escape(policy.spec.advice)}"))
    blocks.append(
        context(
            f"Mode {policy.spec.mode.value}. Silence with the annotation `gpu-auditor.io/snooze-until: <RFC 3339 time>` on the job."
        )
    )
    if ack_url and lineage:
        blocks.append(ack_button(ack_url, lineage))
    return text, blocks


def ack_button(url: str, lineage: str) -> dict:
    """A Block Kit button opening the signed acknowledgement link (a JSON field: no mrkdwn escaping)."""
    label = f"Acknowledge {lineage}"
    return {
        "type": "actions",
        "elements": [
            {
                "type": "button",
                "text": {"type": "plain_text", "text": label[:75]},
                "url": url,
                "action_id": "gpu-auditor-ack",
            }
        ],
    }
