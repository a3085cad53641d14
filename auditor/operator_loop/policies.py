"""Policies in the operator loop: which files are loaded, where alerts go, what may be requeued.

Everything here comes from the settings (docs/operator.md; alert routes and requeue scope through
:func:`auditor.policy.config.runner_config`, which ``audit --policies --act`` shares), so the loop itself only calls
:meth:`PolicyStage.run` after each audit cycle. Policy files are re-read every cycle: an edited
ConfigMap takes effect without a restart, and a file that became invalid keeps its last good
version running (:class:`~auditor.policy.loader.PolicyRegistry`).
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import auditor
from auditor.errors import AuditorError
from auditor.policy.loader import PolicyRegistry, read_dir
from auditor.policy.config import runner_config
from auditor.policy.runner import Decision, PolicyRunner
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
