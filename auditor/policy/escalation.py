"""The escalation state machine (pure) and the dedup keys that make it safe to restart.

A *violation* is one episode of a job breaking a policy: it opens on the first cycle the policy
fires, and closes on the first judged cycle it does not. Its state is ``next_step`` (the index of
the next escalation step) and ``last_step_at``. A step is due when

    now >= opened_at + step.after   and   now >= last_step_at + step.cooldown

and at most one step runs per cycle, so the ladder is climbed in order, never skipped. The state
is persisted in the store together with the decision (one transaction), and each decision and
action carries a unique dedup key derived from the violation and the step, so a second leader or
a restarted process that replays a cycle finds the key taken and does nothing.

A job's owner may *snooze* its ladder (issue 30: the alert's link, the console, the CLI): while
a snooze is in force no step is taken on the job, for any policy; the ladder's state is left as
it was, so when the snooze ends the next step is due by the same rules as before.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from auditor.core.identity import JobKey
from auditor.core.job_snooze import JobSnooze
from auditor.core.violations import ViolationState as ViolationState  # re-exported
from auditor.policy.schema import Policy, Step


class LadderSnoozes(Protocol):
    """The snoozed jobs the runner honours: the store implements it
    (:class:`auditor.store.job_snoozes.JobSnoozeLog`); the fast tests a fake."""

    def in_force(self, now: datetime, *, cluster: str | None = None) -> dict[JobKey, JobSnooze]:
        """By job, the snooze in force at ``now`` (one read a cycle)."""
        ...


def due_step(policy: Policy, state: ViolationState, now: datetime) -> tuple[int, Step] | None:
    """The step to run now, or None (ladder done, or still waiting on ``after``/``cooldown``)."""
    steps = policy.spec.escalation
    if state.next_step >= len(steps):
        return None
    step = steps[state.next_step]
    if now < state.opened_at + step.after:
        return None
    if state.last_step_at is not None and now < state.last_step_at + step.cooldown:
        return None
    return state.next_step, step


def job_key(summary: dict) -> str:
    """``cluster/namespace/Kind/name``: a job across clusters sharing one store."""
    return str(JobKey.of_document(summary))


def violation_key(summary: dict, policy: str, episode: int) -> str:
    return f"{job_key(summary)}#{policy}#v{episode}"


def decision_key(summary: dict, policy: str, episode: int, step: int) -> str:
    """Unique per violation and step: a replayed step finds its key taken."""
    return f"{violation_key(summary, policy, episode)}#s{step}"


def action_key(decision: str, action: str) -> str:
    return f"{decision}#{action}"
