"""Policies in the operator loop: which files are loaded, where alerts go, what may be requeued.

Everything here comes from the settings (docs/operator.md), so the loop itself only calls
:meth:`PolicyStage.run` after each audit cycle. Policy files are re-read every cycle: an edited
ConfigMap takes effect without a restart, and a file that became invalid keeps its last good
version running (:class:`~auditor.policy.loader.PolicyRegistry`).
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

import auditor
from auditor.errors import AuditorError
from auditor.policy.loader import PolicyRegistry, read_dir
from auditor.policy.runner import Decision, PolicyRunner, RequeueSettings, Route, RunnerConfig
from auditor.policy.schema import ActionKind
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
    """Every policy file to run: the shipped ones (when ``policies.builtin``) and ``policies.dir``."""
    files: dict[str, str] = {}
    if settings.policies.builtin:
        builtin = builtin_policy_dir(settings)
        if builtin is None:
            log.warning("policies.builtin is on but no shipped policies were found (set policies.builtin_dir)")
        else:
            files.update(read_dir(builtin))
    if settings.policies.dir and Path(settings.policies.dir).is_dir():
        files.update(read_dir(settings.policies.dir))
    return files


def runner_config(settings: Settings, environ: Mapping[str, str] | None = None) -> RunnerConfig:
    """Alert routes and the requeue scope from the settings; secrets from the variables they name."""
    env = os.environ if environ is None else environ

    def secret(name: str | None) -> str | None:
        return env.get(name) if name else None

    n = settings.notifications
    hmac_key = secret(n.webhook.hmac_key_env)
    default = Route(slack_url=secret(n.slack.webhook_url_env), webhook_url=secret(n.webhook.url_env),
                    webhook_secret=hmac_key)
    routes = {
        team: Route(slack_url=secret(r.slack_webhook_url_env), webhook_url=secret(r.webhook_url_env),
                    webhook_secret=hmac_key)
        for team, r in n.routes.items()
    }
    requeue = RequeueSettings(
        enabled=settings.features.requeue,
        namespaces=frozenset(settings.requeue.namespaces),
        queues=frozenset(settings.requeue.queues),
        max_per_hour=settings.requeue.max_per_hour,
    )
    disabled = {kind for kind, on in ((ActionKind.ANNOTATE, settings.features.annotate),
                                      (ActionKind.EVENT, settings.features.events)) if not on}
    return RunnerConfig(cluster=settings.cluster, default_route=default, routes=routes, requeue=requeue,
                        disabled_actions=frozenset(disabled))


class PolicyStage:
    """Runs the policies on each cycle's summaries and acts (the leader only: it runs inside the cycle)."""

    def __init__(self, settings: Settings, store: Any, api: Any, identity: str) -> None:
        from auditor.actions import KubeActions

        self.settings = settings
        self.registry = PolicyRegistry()
        self.runner = PolicyRunner(self.registry, store, KubeActions(api, instance=identity), runner_config(settings))

    def run(self, summaries: list[dict], *, now: datetime) -> list[Decision]:
        """Reload the policy files, then evaluate and act; a failure is logged, never fatal to the cycle."""
        try:
            self.registry.update(policy_files(self.settings))
            if not self.registry.policies:
                return []
            decisions = self.runner.run_cycle(summaries, now=now, act=True)
        except AuditorError as exc:
            log.error("policies: %s", exc)
            return []
        for d in decisions:
            if d.step is not None:
                log.info("policy %s on %s (step %d): %s", d.policy, d.job, d.step, ", ".join(d.actions) or "recorded")
        return decisions
