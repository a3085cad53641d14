"""What is remembered of one open policy violation: the escalation ladder's position.

A plain value shared by the policy runner (which decides the next step from it) and the
decision log in the store (which persists it), so neither has to import the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class ViolationState:
    """What the store remembers of one open violation."""

    id: int | None
    episode: int
    opened_at: datetime
    next_step: int
    last_step_at: datetime | None


#: States of one recorded action: claimed before it runs, then done, failed, skipped,
#: waiting (a requeue's reactivation is due later), or queued (an alert the operator's delivery
#: queue sends off the cycle: ``due_at`` is its next try).
CLAIMED, DONE, FAILED, SKIPPED, WAITING = "claimed", "done", "failed", "skipped", "waiting"
QUEUED = "queued"
