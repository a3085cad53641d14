"""A paused escalation ladder: who snoozed a running job's policy ladder, when, until when, why.

The gate's acknowledgement (:mod:`auditor.core.gate`) is about a *lineage*'s next submissions;
a job snooze is about the *running* job (issue 30): while one is in force the policy runner takes
no escalation step on the job (no alert again, no annotation, no Event, no requeue) for any
policy, and when it ends the ladder goes on from the step it had reached. Recorded like an
acknowledgement, so ``explain``, ``status`` and the console can say who paused what and until
when. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

from auditor.core.identity import JobKey


@dataclass(frozen=True, slots=True)
class JobSnooze:
    """``by`` paused ``job``'s ladder at ``at`` until ``until`` (``via``: link, console, cli)."""

    job: JobKey
    by: str
    at: datetime
    until: datetime
    reason: str = ""
    via: str = "cli"

    def active(self, now: datetime) -> bool:
        """In force at ``now``: made by then and not yet over."""
        return self.at <= now < self.until

    def text(self) -> str:
        """``snoozed until 2026-12-01T10:00:00Z by link:team:vision``: the runner's ``blocked``
        and the line ``explain``, ``status`` and the console print."""
        return f"snoozed until {_iso(self.until)} by {self.by}" + (f" ({self.reason})" if self.reason else "")

    def to_json(self) -> dict[str, str]:
        """The snooze in ``explain``'s and ``status``'s JSON."""
        return {
            "cluster": self.job.cluster,
            "job": f"{self.job.namespace}/{self.job.kind}/{self.job.name}",
            "by": self.by,
            "at": _iso(self.at),
            "until": _iso(self.until),
            "reason": self.reason,
            "via": self.via,
        }


def in_force(snoozes: Iterable[JobSnooze], now: datetime) -> dict[JobKey, JobSnooze]:
    """By job, the snooze in force at ``now`` that lasts longest (a later, shorter one does not
    cut an earlier, longer one short: either owner asked for at least that long)."""
    out: dict[JobKey, JobSnooze] = {}
    for s in snoozes:
        if s.active(now) and (s.job not in out or s.until > out[s.job].until):
            out[s.job] = s
    return out


def snooze_lines(snoozes: Iterable[JobSnooze], now: datetime) -> list[str]:
    """``explain``'s lines on a job's snoozes, newest first: the one in force says so, the rest
    are history (who paused the ladder before)."""
    out = []
    for s in sorted(snoozes, key=lambda s: s.at, reverse=True):
        state = "in force" if s.active(now) else ("not yet" if now < s.at else "over")
        out.append(f"  {s.text()}, made {_iso(s.at)} via {s.via} ({state})")
    return ["Escalation snoozes (the policy ladder takes no step while one is in force):", *out] if out else []


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")
