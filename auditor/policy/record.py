"""The escalation record the policy runner keeps: its port onto the decision log.

The store implements it (:class:`auditor.store.decisions.DecisionStore`); the fast tests run the
runner on an in-memory fake. ``job`` is a :class:`~auditor.core.identity.JobKey`; rows of
actions have the fields of :class:`auditor.store.decisions.ActionRow`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Iterable, Mapping, Protocol, Sequence

from auditor.core.identity import JobKey
from auditor.core.lineage import LINEAGE_LABEL
from auditor.core.model import JobRef
from auditor.core.violations import ViolationState


class EscalationRecord(Protocol):
    """Violations, the decisions that climbed their ladders, and each decision's actions."""

    def open_violation(
        self, job: JobKey, policy: str, now: datetime, evidence: dict, uid: str | None = None
    ) -> ViolationState: ...

    def open_violations(
        self, job: JobKey | None = None, policy: str | None = None
    ) -> list[tuple[JobKey, str, ViolationState]]: ...

    def close_violation(self, job: JobKey, policy: str, now: datetime) -> bool: ...

    def claim_step(
        self,
        job: JobKey,
        policy: str,
        violation: ViolationState,
        step: int,
        *,
        dedup_key: str,
        mode: str,
        action_names: list[str],
        action_keys: list[str],
        now: datetime,
        dry_run: bool,
        verdict: str,
        reason: str,
        evidence: dict,
    ) -> int | None: ...

    def finish_action(
        self,
        key: str,
        state: str,
        now: datetime,
        *,
        result: dict | None = None,
        error: str | None = None,
        due_at: datetime | None = None,
    ) -> None: ...

    def take_action(self, key: str, from_state: str, to_state: str, now: datetime) -> bool: ...

    def actions_in(
        self, states: Iterable[str], *, cluster: str | None = None, action: str | None = None
    ) -> list[Any]: ...

    def count_actions(
        self, action: str, *, since: datetime, cluster: str | None = None, states: Iterable[str] = ...
    ) -> int: ...

    def count_job_actions(self, job: JobKey, action: str, states: Iterable[str] = ...) -> int: ...

    def decisions(
        self, *, since: datetime | None = None, until: datetime | None = None, job: JobKey | None = None
    ) -> list[dict]: ...

    def stale_claims(self, now: datetime, older_than: timedelta, *, cluster: str) -> list[Any]: ...

    def action_rows(self, keys: Iterable[str]) -> dict[str, Any]:
        """The recorded actions of these dedup keys (those that exist), by key."""
        ...


class LineageMfu(Protocol):
    """The lineages' history the ``lineage`` condition reads (``below its own best run``): the
    store implements it (:meth:`auditor.store.Store.lineage_best_mfu`, as the audit's lineage-best
    reference does), one batched read for a cycle's jobs."""

    def lineage_best_mfu(self, jobs: Sequence[JobRef]) -> dict[str, float]:
        """By job key: the best MFU estimate of the other runs of each job's lineage that started
        before it; jobs without one are left out."""
        ...


def lineage_ref(doc: Mapping[str, Any]) -> JobRef:
    """The job of an audit-JSON summary as the lineage lookup needs it: its identity and its
    lineage label (``kube.lineage``, where the operator's cycle put it)."""
    kind, _, name = str(doc.get("job") or "").partition("/")
    label = (doc.get("kube") or {}).get("lineage")
    return JobRef(
        cluster=str(doc.get("cluster") or "default"),
        namespace=str(doc.get("namespace") or ""),
        kind=kind,
        name=name,
        uid=doc.get("uid"),
        team=str(doc.get("team") or ""),
        labels=((LINEAGE_LABEL, label),) if isinstance(label, str) else (),
    )


def lineage_best(reader: LineageMfu | None, docs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """:meth:`LineageMfu.lineage_best_mfu` of the jobs of ``docs`` (empty without a reader)."""
    if reader is None or not docs:
        return {}
    return reader.lineage_best_mfu([lineage_ref(d) for d in docs])
