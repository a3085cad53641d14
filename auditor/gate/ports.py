"""The small interfaces the admission use-case depends on (implemented by the store and the core).

The use-case never imports the store or the Kubernetes client: it is given something that reads a
lineage's history, something that records an acknowledgement and the pure ``decide`` function, so
it is tested with fakes as readily as with the real PostgreSQL store.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol, Sequence


class Key(Protocol):
    """A lineage's identity (``auditor.core.lineage.LineageKey``)."""

    @property
    def cluster(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def lineage(self) -> str: ...


class Decision(Protocol):
    """What the core's ``decide`` answers (``auditor.core.gate.GateDecision``)."""

    @property
    def action(self) -> str: ...  # admit | admit-deprioritized | hold
    @property
    def would(self) -> str: ...  # what enforce would do (differs from action in observe mode)
    @property
    def reason(self) -> str: ...
    @property
    def evidence(self) -> Sequence[str]: ...
    @property
    def rule(self) -> str | None: ...
    @property
    def acknowledged_until(self) -> datetime | None: ...


class HistoryReader(Protocol):
    """``auditor.store.lineage.LineageHistoryReader``: a lineage's verdicts, findings and acks."""

    def history(self, key: Any, now: datetime) -> Any: ...


class AckRecorder(Protocol):
    """``auditor.store.lineage.AckLog``: records who acknowledged a lineage, until when, and why."""

    def acknowledge(
        self, key: Any, by: str, until: datetime | None, reason: str, now: datetime, *, via: str = ...
    ) -> Any: ...


class Decide(Protocol):
    """``auditor.core.gate.decide``: pure, ``now`` passed in."""

    def __call__(self, history: Any, rules: Any, mode: str, now: datetime) -> Decision: ...
