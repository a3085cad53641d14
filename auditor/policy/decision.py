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

    def outcome(self) -> tuple[bool, str]:
        """(whether nothing went wrong, what happened in a few words), from the results: what
        the CLI prints and the operator logs, so a failed or undelivered alert never reads as
        done."""
        if self.step is None:
            return True, f"waiting: {self.blocked}" if self.blocked else "waiting: cooldown or done"
        if self.blocked and not self.dry_run:
            return True, f"blocked: {self.blocked}"
        if self.dry_run:
            return True, "dry-run"
        if self.results.get("claimed") is False:
            return True, "already done by another replica or an earlier run"
        failed, notes = [], []
        for action in self.actions:
            r = self.results.get(action)
            if not isinstance(r, dict):
                continue
            state = r.get("state")
            if state == "failed":
                failed.append(f"{action} failed: {r.get('error') or 'unknown error'}")
            elif state == "queued":
                notes.append(f"{action} queued for delivery")
            elif state == "skipped" and r.get("reason") == "no_destination":
                failed.append(f"{action} not delivered: {r.get('why')}")
            elif state == "skipped":
                notes.append(f"{action} skipped: {r.get('why')}")
        if failed:
            return False, "; ".join(failed + notes)
        return True, "; ".join(["acted"] + notes)

    def summary_line(self, dry_run: bool = False) -> str:
        """``<actions> (<outcome>)``: one line per decision."""
        what = ", ".join(self.actions) if self.step is not None else "nothing"
        _, text = self.outcome()
        return f"{what} ({'dry run: would do' if dry_run else text})"

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
