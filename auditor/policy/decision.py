"""One policy's outcome on one job in one cycle, as the runner returns it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
