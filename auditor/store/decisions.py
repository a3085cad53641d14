"""Decisions, actions and violations (migration 0002), on a :class:`~auditor.store.Store`.

This is the memory that makes policies safe to restart: every step is claimed here, under a
unique dedup key, in the same transaction that advances the violation's escalation state, and
before any side effect runs. A replayed cycle, a restarted process or a second leader finds the
key taken (or the state already advanced) and does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterable

import sqlalchemy as sa

from auditor.core.identity import JobKey
from auditor.core.violations import CLAIMED as CLAIMED  # re-exported
from auditor.core.violations import DONE as DONE  # re-exported
from auditor.core.violations import FAILED as FAILED  # re-exported
from auditor.core.violations import SKIPPED as SKIPPED  # re-exported
from auditor.core.violations import WAITING as WAITING  # re-exported
from auditor.core.violations import ViolationState
from auditor.errors import StoreError
from auditor.store.policy_tables import actions, decisions, violations
from auditor.store.store import Store


def _where(job: JobKey, table: sa.Table) -> sa.ColumnElement[bool]:
    """The rows of ``table`` about ``job``."""
    return sa.and_(
        table.c.cluster == job.cluster,
        table.c.namespace == job.namespace,
        table.c.kind == job.kind,
        table.c.name == job.name,
    )


@dataclass(frozen=True)
class ActionRow:
    id: int
    dedup_key: str
    decision_id: int | None
    job: JobKey
    policy: str
    action: str
    state: str
    attempts: int
    created_at: datetime
    updated_at: datetime
    due_at: datetime | None
    result: dict
    error: str | None


def _action(r: Any) -> ActionRow:
    return ActionRow(
        r.id,
        r.dedup_key,
        r.decision_id,
        JobKey(r.cluster, r.namespace, r.kind, r.name),
        r.policy,
        r.action,
        r.state,
        r.attempts,
        r.created_at,
        r.updated_at,
        r.due_at,
        dict(r.result or {}),
        r.error,
    )


def _state(r: Any) -> ViolationState:
    return ViolationState(r.id, r.episode, r.opened_at, r.next_step, r.last_step_at)


def _new_id(result: sa.CursorResult[Any]) -> int:
    """The id an INSERT gave its row (SQLAlchemy types the key as optional: a non-INSERT has none)."""
    key = result.inserted_primary_key
    if key is None:  # pragma: no cover - every caller passes an INSERT's result
        raise StoreError("the database returned no id for an inserted row")
    return int(key[0])


class DecisionStore:
    """Repository of violations, decisions and actions on one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # ------------------------------------------------------------------ violations

    def open_violation(
        self, job: JobKey, policy: str, now: datetime, evidence: dict, uid: str | None = None
    ) -> ViolationState:
        """The job's open violation of ``policy``, opened now if there is none."""
        for _ in range(3):
            with self.store.writing("open a violation", own=True) as conn:
                row = conn.execute(
                    sa.select(violations).where(
                        _where(job, violations), violations.c.policy == policy, violations.c.state == "open"
                    )
                ).first()
                if row is not None:
                    conn.execute(violations.update().where(violations.c.id == row.id).values(last_seen_at=now))
                    return _state(row)
                last = conn.execute(
                    sa.select(sa.func.max(violations.c.episode)).where(
                        _where(job, violations), violations.c.policy == policy
                    )
                ).scalar()
                try:
                    with conn.begin_nested():
                        vid = _new_id(
                            conn.execute(
                                violations.insert().values(
                                    **job.columns(),
                                    uid=uid,
                                    policy=policy,
                                    episode=(last or 0) + 1,
                                    state="open",
                                    opened_at=now,
                                    last_seen_at=now,
                                    next_step=0,
                                    evidence=evidence,
                                )
                            )
                        )
                except sa.exc.IntegrityError:
                    continue  # another replica opened it at the same moment: read theirs
                return ViolationState(vid, (last or 0) + 1, now, 0, None)
        raise RuntimeError("could not open a violation")  # pragma: no cover

    def open_violations(
        self, job: JobKey | None = None, policy: str | None = None
    ) -> list[tuple[JobKey, str, ViolationState]]:
        q = sa.select(violations).where(violations.c.state == "open")
        if job is not None:
            q = q.where(_where(job, violations))
        if policy is not None:
            q = q.where(violations.c.policy == policy)
        with self.store.reading("read violations") as conn:
            return [
                (JobKey(r.cluster, r.namespace, r.kind, r.name), r.policy, _state(r))
                for r in conn.execute(q.order_by(violations.c.id))
            ]

    def close_violation(self, job: JobKey, policy: str, now: datetime) -> bool:
        """Close the open violation (the policy stopped firing): a later one starts a new ladder."""
        with self.store.writing("close a violation", own=True) as conn:
            n = conn.execute(
                violations.update()
                .where(_where(job, violations), violations.c.policy == policy, violations.c.state == "open")
                .values(state="closed", closed_at=now)
            ).rowcount
        return bool(n)

    # ------------------------------------------------------------------ decisions

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
    ) -> int | None:
        """Record the decision to run ``step`` and advance the violation, atomically.

        Returns the decision id, or None when the step was already taken (dedup key present, or
        the violation already moved past it): then the caller must do nothing.
        """
        try:
            with self.store.writing("claim a step", own=True) as conn:
                moved = conn.execute(
                    violations.update()
                    .where(
                        violations.c.id == violation.id, violations.c.next_step == step, violations.c.state == "open"
                    )
                    .values(next_step=step + 1, last_step_at=now)
                ).rowcount
                if moved != 1:
                    raise _Taken()
                did = _new_id(
                    conn.execute(
                        decisions.insert().values(
                            dedup_key=dedup_key,
                            violation_id=violation.id,
                            **job.columns(),
                            policy=policy,
                            mode=mode,
                            step=step,
                            actions=action_names,
                            decided_at=now,
                            dry_run=dry_run,
                            verdict=verdict,
                            reason=reason,
                            evidence=evidence,
                        )
                    )
                )
                for name, key in zip(action_names, action_keys):
                    conn.execute(
                        actions.insert().values(
                            dedup_key=key,
                            decision_id=did,
                            **job.columns(),
                            policy=policy,
                            action=name,
                            state=SKIPPED if dry_run else CLAIMED,
                            attempts=0,
                            created_at=now,
                            updated_at=now,
                            result={"dry_run": True} if dry_run else {},
                        )
                    )
                return did
        except _Taken:
            return None
        except Exception as exc:
            if _duplicate(exc):
                return None
            raise

    def finish_action(
        self,
        key: str,
        state: str,
        now: datetime,
        *,
        result: dict | None = None,
        error: str | None = None,
        due_at: datetime | None = None,
    ) -> None:
        with self.store.writing("record an action", own=True) as conn:
            conn.execute(
                actions.update()
                .where(actions.c.dedup_key == key)
                .values(
                    state=state,
                    updated_at=now,
                    result=result or {},
                    error=error,
                    due_at=due_at,
                    attempts=actions.c.attempts + 1,
                )
            )

    def take_action(self, key: str, from_state: str, to_state: str, now: datetime) -> bool:
        """Move an action between states only if it is still in ``from_state`` (compare-and-set),
        so two replicas cannot both run the reactivation of one requeue."""
        with self.store.writing("take an action", own=True) as conn:
            n = conn.execute(
                actions.update()
                .where(actions.c.dedup_key == key, actions.c.state == from_state)
                .values(state=to_state, updated_at=now)
            ).rowcount
        return n == 1

    def actions_in(
        self, states: Iterable[str], *, cluster: str | None = None, action: str | None = None
    ) -> list[ActionRow]:
        q = sa.select(actions).where(actions.c.state.in_(list(states)))
        if cluster is not None:
            q = q.where(actions.c.cluster == cluster)
        if action is not None:
            q = q.where(actions.c.action == action)
        with self.store.reading("read actions") as conn:
            return [_action(r) for r in conn.execute(q.order_by(actions.c.id))]

    def count_actions(
        self,
        action: str,
        *,
        since: datetime,
        cluster: str | None = None,
        states: Iterable[str] = (CLAIMED, DONE, WAITING),
    ) -> int:
        q = (
            sa.select(sa.func.count())
            .select_from(actions)
            .where(actions.c.action == action, actions.c.created_at >= since, actions.c.state.in_(list(states)))
        )
        if cluster is not None:
            q = q.where(actions.c.cluster == cluster)
        with self.store.reading("count actions") as conn:
            return int(conn.execute(q).scalar_one())

    def count_job_actions(self, job: JobKey, action: str, states: Iterable[str] = (CLAIMED, DONE, WAITING)) -> int:
        q = (
            sa.select(sa.func.count())
            .select_from(actions)
            .where(_where(job, actions), actions.c.action == action, actions.c.state.in_(list(states)))
        )
        with self.store.reading("count actions") as conn:
            return int(conn.execute(q).scalar_one())

    def decisions(
        self, *, since: datetime | None = None, until: datetime | None = None, job: JobKey | None = None
    ) -> list[dict]:
        q = sa.select(decisions)
        if since is not None:
            q = q.where(decisions.c.decided_at >= since)
        if until is not None:
            q = q.where(decisions.c.decided_at < until)
        if job is not None:
            q = q.where(_where(job, decisions))
        with self.store.reading("read decisions") as conn:
            return [dict(r._mapping) for r in conn.execute(q.order_by(decisions.c.id))]

    def actions(
        self,
        *,
        job: JobKey | None = None,
        since: datetime | None = None,
        states: Iterable[str] | None = None,
        cluster: str | None = None,
    ) -> list[ActionRow]:
        """Recorded actions, oldest first; ``since`` keeps those created or updated from then on."""
        q = sa.select(actions)
        if job is not None:
            q = q.where(_where(job, actions))
        if since is not None:
            q = q.where(sa.or_(actions.c.created_at >= since, actions.c.updated_at >= since))
        if states is not None:
            q = q.where(actions.c.state.in_(list(states)))
        if cluster is not None:
            q = q.where(actions.c.cluster == cluster)
        with self.store.reading("read actions") as conn:
            return [_action(r) for r in conn.execute(q.order_by(actions.c.id))]

    def action_rows(self, keys: Iterable[str]) -> dict[str, ActionRow]:
        """The actions of these dedup keys (a violation's earlier alerts), by key."""
        wanted = list(keys)
        if not wanted:
            return {}
        with self.store.reading("read actions") as conn:
            rows = conn.execute(sa.select(actions).where(actions.c.dedup_key.in_(wanted)))
            return {r.dedup_key: _action(r) for r in rows}

    def stale_claims(self, now: datetime, older_than: timedelta, *, cluster: str) -> list[ActionRow]:
        """Actions of ``cluster`` claimed but never finished (the process died in between): to
        resume. Only that cluster's: its operator resumes them against its own API server, so
        it must never pick up another cluster's sharing the store."""
        q = sa.select(actions).where(
            actions.c.cluster == cluster, actions.c.state == CLAIMED, actions.c.updated_at < now - older_than
        )
        with self.store.reading("read actions") as conn:
            return [_action(r) for r in conn.execute(q.order_by(actions.c.id))]

    def record_would_do(
        self,
        job: JobKey,
        policy: str,
        *,
        dedup_key: str,
        mode: str,
        step: int,
        action_names: list[str],
        now: datetime,
        verdict: str,
        reason: str,
        evidence: dict,
    ) -> bool:
        """Record a decision a dry run (``run --dry-run``) would have carried out.

        It is a decision row only (``dry_run`` true, no violation, no action rows), so it never
        moves an escalation ladder, takes a dedup key the acting operator needs, or counts
        towards a rate limit. ``dedup_key`` must be the dry run's own; a repeat is ignored
        (returns False).
        """
        try:
            with self.store.writing("record a dry-run decision", own=True) as conn:
                conn.execute(
                    decisions.insert().values(
                        dedup_key=dedup_key,
                        violation_id=None,
                        **job.columns(),
                        policy=policy,
                        mode=mode,
                        step=step,
                        actions=action_names,
                        decided_at=now,
                        dry_run=True,
                        verdict=verdict,
                        reason=reason,
                        evidence=evidence,
                    )
                )
            return True
        except Exception as exc:
            if _duplicate(exc):
                return False
            raise


class _Taken(Exception):
    pass


def _duplicate(exc: Exception) -> bool:
    """The write hit a unique key (the store wraps the driver's IntegrityError): already recorded."""
    return isinstance(getattr(exc, "__cause__", None), sa.exc.IntegrityError) or isinstance(exc, sa.exc.IntegrityError)
