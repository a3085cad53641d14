"""Policies in the operator loop: which files are loaded, where alerts go, what may be requeued.

Everything here comes from the settings (docs/operator.md; alert routes and requeue scope through
:func:`auditor.policy.config.runner_config`, which ``audit --policies --act`` shares), so the loop itself only calls
:meth:`PolicyStage.run` after each audit cycle. Policy files are re-read every cycle: an edited
ConfigMap takes effect without a restart, and a file that became invalid keeps its last good
version running (:class:`~auditor.policy.loader.PolicyRegistry`).
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

import auditor
from auditor.core.identity import JobKey
from auditor.core.job_summary import JobSummary
from auditor.errors import AuditorError
from auditor.policy.config import runner_config
from auditor.policy.loader import PolicyRegistry, layered, read_dir
from auditor.policy.outbox import AlertOutbox, DrainResult
from auditor.policy.runner import Decision, PolicyRunner
from auditor.ports import CheckRequeue, ClusterActions
from auditor.settings import Settings

log = logging.getLogger(__name__)

#: where the image puts the shipped policies (operator/Dockerfile)
IMAGE_POLICIES = Path("/usr/share/gpu-auditor/policies")


def builtin_policy_dir(settings: Settings) -> Path | None:
    """The shipped policies: the configured directory, the image's copy, or a checkout's ``policies/``."""
    candidates = [Path(settings.policies.builtin_dir)] if settings.policies.builtin_dir else []
    candidates += [IMAGE_POLICIES, Path(auditor.__file__).resolve().parent.parent / "policies"]
    return next((d for d in candidates if d.is_dir()), None)


def policy_files(settings: Settings) -> dict[str, str]:
    """Every policy file to run: the shipped ones (when ``policies.builtin``) and ``policies.dir``,
    whose policies replace shipped ones of the same name (:class:`~auditor.policy.loader.PolicyFiles`)."""
    shipped: dict[str, str] = {}
    if settings.policies.builtin:
        builtin = builtin_policy_dir(settings)
        if builtin is None:
            log.warning("policies.builtin is on but no shipped policies were found (set policies.builtin_dir)")
        else:
            shipped = read_dir(builtin)
    admin: dict[str, str] = {}
    if settings.policies.dir and Path(settings.policies.dir).is_dir():
        admin = read_dir(settings.policies.dir)
    return layered(shipped, admin)


#: prefix of the dedup keys of ``run --dry-run``'s would-do decisions (never an acting operator's key)
DRY_RUN_KEY = "dry-run:"


class PolicyStage:
    """Runs the policies on each cycle's summaries and acts (the leader only: it runs inside the cycle).

    With ``dry_run`` it decides the same way but acts on nothing (no Kubernetes write, no
    notification, no resumed action) and records each due step as a would-do decision instead.
    """

    def __init__(
        self,
        settings: Settings,
        store: Any,
        actions: ClusterActions,
        *,
        dry_run: bool = False,
        check_requeue: CheckRequeue | None = None,
    ) -> None:
        from auditor.store.decisions import DecisionStore

        self.settings = settings
        self.dry_run = dry_run
        self.registry = PolicyRegistry()
        # alerts wait in the persisted queue and go out from the delivery job (:meth:`deliver`),
        # so a slow receiver never holds up a cycle
        config = dataclasses.replace(runner_config(settings), queue_alerts=True)
        self.runner = PolicyRunner(self.registry, store, actions, config, check_requeue=check_requeue)
        self.repo = DecisionStore(store)
        self.outbox = AlertOutbox(self.repo, config)
        #: decisions are recorded as would-do: ``run --dry-run``, or the installation's ``mode: audit``
        #: (docs/install.md, "A quiet start"), whose decisions say so in their evidence
        self.would_do = dry_run or config.audit_only
        self._install_mode = {"install_mode": "audit"} if config.audit_only else {}

    def deliver(self, now: datetime, *, budget: float) -> DrainResult:
        """Send the queued alerts that are due (one pass, at most ``budget`` seconds); a store
        failure is logged, never raised (the next pass tries again)."""
        if self.dry_run:
            return DrainResult()
        try:
            result = self.outbox.drain(now, budget=budget)
        except AuditorError as exc:
            log.error("alert delivery: %s", exc)
            return DrainResult()
        if result.tried:
            log.info(
                "alerts: %d delivered, %d failed, %d to retry, %d left for the next pass",
                len(result.sent),
                len(result.failed),
                len(result.retrying),
                result.left,
            )
        return result

    def run(self, summaries: Sequence[JobSummary], *, now: datetime) -> list[Decision]:
        """Reload the policy files, then evaluate and act; a failure is logged, never fatal to the cycle."""
        try:
            self.registry.update(policy_files(self.settings))
            if not self.registry.policies:
                return []
            decisions = self.runner.run_cycle(summaries, now=now, act=not self.dry_run)
            if self.would_do:
                self._record_would_do(decisions, now)
        except AuditorError as exc:
            log.error("policies: %s", exc)
            return []
        for d in decisions:
            if d.step is not None:
                log.info("policy %s on %s (step %d): %s", d.policy, d.job, d.step, d.summary_line(self.would_do))
        return decisions

    def _record_would_do(self, decisions: list[Decision], now: datetime) -> None:

        for d in decisions:
            if d.step is None or d.dedup_key is None:
                continue  # waiting (cooldown, snooze): nothing would happen this cycle
            job = JobKey.parse(d.job)
            self.repo.record_would_do(
                JobKey(job.cluster, job.namespace, job.kind, job.name),
                d.policy,
                dedup_key=DRY_RUN_KEY + d.dedup_key,
                mode=d.mode,
                step=d.step,
                action_names=d.actions,
                now=now,
                verdict=str(d.verdict),
                reason=d.reason,
                evidence={**d.evidence, "would_do": True, **self._install_mode},
            )
