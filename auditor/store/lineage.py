"""Lineages on a :class:`~auditor.store.Store` (migration 0009): runs, acknowledgements, snoozes.

The efficiency gate decides a submission from this alone (DESIGN.md: a fast lookup, no
Prometheus), so one lineage's history is two indexed reads. Three roles, three small classes:

- :class:`LineageRecorder` — the audit writes each job's latest verdict as a run of its lineage;
- :class:`LineageHistoryReader` — the gate (and ``explain``, the report, ``policy simulate``)
  reads a lineage's history;
- :class:`AckLog` — ``gpu-auditor ack``, the signed link and the annotation path record who
  acknowledged or snoozed a lineage, when, until when and why. A signed link's id is unique in
  the log, so a link acknowledges once.

Runs are kept by their job's identity (kind, name, uid), not by the ``jobs`` row: the history of
a lineage outlives the retention of the buckets it was judged on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from auditor.core.gate import AckKind, Acknowledgement, LineageHistory, LineageRun
from auditor.core.lineage import LineageKey
from auditor.errors import BadInput, StoreError
from auditor.store.lineage_tables import TABLES as TABLES  # re-exported
from auditor.store.lineage_tables import (
    is_lineage,
    lineage_acks,
    lineage_id_of,
    lineage_runs,
    lineages,
    record_run,
)
from auditor.store.lineage_tables import run_of as run_of  # re-exported
from auditor.store.store import Store


class LinkAlreadyUsed(BadInput):
    """A signed acknowledgement link was used before: a link acknowledges once."""


class LineageRecorder:
    """Writes each audited job's latest verdict as one run of its lineage (idempotent per job)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def record(self, key: LineageKey, run: LineageRun, now: datetime, *, team: str = "") -> None:
        """Store ``run`` under ``key``, replacing what an earlier cycle recorded of the same job."""
        with self.store.writing(f"record run {run.job} of lineage {key}") as conn:
            record_run(conn, key, run, now, team=team)


@dataclass(frozen=True, slots=True)
class LineageSummary:
    """One lineage as a list shows it: its key, team, number of runs and last activity."""

    key: LineageKey
    team: str
    runs: int
    last_seen: datetime


class LineageHistoryReader:
    """The gate's store port: one lineage's history in two indexed reads."""

    def __init__(self, store: Store, *, max_runs: int = 50) -> None:
        self.store = store
        self.max_runs = max_runs

    def history(self, key: LineageKey, now: datetime) -> LineageHistory:
        """The ``max_runs`` newest runs (oldest first) and every acknowledgement of ``key``.

        An unknown lineage has an empty history (a first submission is admitted clean). ``now``
        bounds nothing here (:func:`auditor.core.gate.decide` weighs the runs as of its ``now``);
        it is part of the port so that a reader may cache.
        """
        del now
        with self.store.reading(f"read the history of lineage {key}") as conn:
            row = conn.execute(sa.select(lineages.c.id, lineages.c.team).where(is_lineage(key))).first()
            if row is None:
                return LineageHistory(key)
            return self._history(conn, key, row.id, row.team)

    def histories(self, *, cluster: str | None = None, since: datetime | None = None) -> list[LineageHistory]:
        """Every lineage seen since ``since`` (``policy simulate``, the report), by key."""
        q = sa.select(lineages)
        if cluster is not None:
            q = q.where(lineages.c.cluster == cluster)
        if since is not None:
            q = q.where(lineages.c.last_seen >= since)
        with self.store.reading("read lineage histories") as conn:
            rows = conn.execute(q.order_by(lineages.c.cluster, lineages.c.namespace, lineages.c.lineage)).all()
            return [self._history(conn, _key(r), r.id, r.team) for r in rows]

    def lineage_of_job(self, namespace: str, kind: str, name: str, cluster: str | None = None) -> LineageKey | None:
        """The lineage a stored job was recorded under (``explain``), or None."""
        q = (
            sa.select(lineages)
            .join(lineage_runs, lineage_runs.c.lineage_id == lineages.c.id)
            .where(lineages.c.namespace == namespace, lineage_runs.c.job_kind == kind, lineage_runs.c.job_name == name)
        )
        if cluster is not None:
            q = q.where(lineages.c.cluster == cluster)
        with self.store.reading(f"find the lineage of {namespace}/{kind}/{name}") as conn:
            row = conn.execute(q.order_by(lineage_runs.c.recorded_at.desc()).limit(1)).first()
        return None if row is None else _key(row)

    def history_of_job(
        self, namespace: str, kind: str, name: str, cluster: str | None, now: datetime
    ) -> LineageHistory | None:
        """The history, as of ``now``, of the lineage a stored job was recorded under, or None
        (``explain`` and the weekly report's top jobs)."""
        key = self.lineage_of_job(namespace, kind, name, cluster)
        return None if key is None else self.history(key, now)

    def lineages(self, *, cluster: str | None = None, namespace: str | None = None) -> list[LineageSummary]:
        """Known lineages with their run counts, most recently seen first."""
        n = sa.func.count(lineage_runs.c.job_name)
        q = (
            sa.select(lineages, n.label("runs"))
            .outerjoin(lineage_runs, lineage_runs.c.lineage_id == lineages.c.id)
            .group_by(*lineages.c)
        )
        if cluster is not None:
            q = q.where(lineages.c.cluster == cluster)
        if namespace is not None:
            q = q.where(lineages.c.namespace == namespace)
        with self.store.reading("list lineages") as conn:
            rows = conn.execute(q.order_by(lineages.c.last_seen.desc(), lineages.c.id)).all()
        return [LineageSummary(_key(r), r.team, int(r.runs), r.last_seen) for r in rows]

    def _history(self, conn: sa.Connection, key: LineageKey, lid: int, team: str) -> LineageHistory:
        r = lineage_runs.c
        newest = (
            sa.select(lineage_runs)
            .where(r.lineage_id == lid)
            .order_by(sa.case((r.start.is_(None), 1), else_=0), r.start.desc(), r.end.desc(), r.job_name)
            .limit(self.max_runs)
        )
        runs = [_run(x) for x in conn.execute(newest)]
        acks = conn.execute(
            sa.select(lineage_acks)
            .where(lineage_acks.c.lineage_id == lid)
            .order_by(lineage_acks.c.at, lineage_acks.c.id)
        )
        return LineageHistory(key, tuple(reversed(runs)), tuple(_ack(a) for a in acks), team)


class AckLog:
    """Acknowledgements and snoozes of lineages: who, when, until when, why, through what."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def acknowledge(
        self,
        key: LineageKey,
        by: str,
        until: datetime | None,
        reason: str,
        now: datetime,
        *,
        via: str = "cli",
        link_id: str | None = None,
        kind: AckKind = AckKind.ACK,
    ) -> Acknowledgement:
        """Record that ``by`` acknowledged ``key`` at ``now`` (valid until ``until``, None: no end).

        ``link_id`` (a signed link's id) may be used once: a second use raises
        :class:`LinkAlreadyUsed` and records nothing. ``kind`` snooze admits every submission
        until ``until`` (which it then needs).
        """
        if not by.strip():
            raise BadInput("an acknowledgement needs who made it (by)")
        if until is not None and until <= now:
            raise BadInput(f"until {until.isoformat()} is not after now ({now.isoformat()})")
        if kind is AckKind.SNOOZE and until is None:
            raise BadInput("a snooze needs an end (until)")
        ack = Acknowledgement(by=by.strip(), at=now, until=until, reason=reason.strip(), kind=kind, via=via)
        try:
            with self.store.writing(f"acknowledge lineage {key}") as conn:
                lid = lineage_id_of(conn, key, now)
                conn.execute(
                    lineage_acks.insert().values(
                        lineage_id=lid,
                        kind=ack.kind.value,
                        by=ack.by,
                        at=ack.at,
                        until=ack.until,
                        reason=ack.reason,
                        via=ack.via,
                        link_id=link_id,
                    )
                )
        except StoreError as exc:
            if link_id is not None and self.link_used(link_id):
                raise LinkAlreadyUsed(f"this acknowledgement link was already used ({link_id})") from exc
            raise
        return ack

    def snooze(
        self, key: LineageKey, by: str, until: datetime, reason: str, now: datetime, *, via: str = "cli"
    ) -> Acknowledgement:
        """Admit every submission of ``key`` until ``until`` (recorded like an acknowledgement)."""
        return self.acknowledge(key, by, until, reason, now, via=via, kind=AckKind.SNOOZE)

    def link_used(self, link_id: str) -> bool:
        with self.store.reading("look up an acknowledgement link") as conn:
            found = conn.execute(sa.select(lineage_acks.c.id).where(lineage_acks.c.link_id == link_id)).first()
        return found is not None

    def acks(self, key: LineageKey) -> list[Acknowledgement]:
        """Every acknowledgement and snooze of ``key``, oldest first."""
        q = (
            sa.select(lineage_acks)
            .join(lineages, lineages.c.id == lineage_acks.c.lineage_id)
            .where(is_lineage(key))
            .order_by(lineage_acks.c.at, lineage_acks.c.id)
        )
        with self.store.reading(f"read acknowledgements of {key}") as conn:
            return [_ack(a) for a in conn.execute(q)]

    def since(self, after: datetime, *, cluster: str | None = None) -> list[tuple[LineageKey, Acknowledgement]]:
        """Acknowledgements and snoozes made after ``after``, oldest first (the gate releases
        the holds of these lineages)."""
        q = (
            sa.select(lineage_acks, lineages.c.cluster, lineages.c.namespace, lineages.c.lineage)
            .join(lineages, lineages.c.id == lineage_acks.c.lineage_id)
            .where(lineage_acks.c.at > after)
            .order_by(lineage_acks.c.at, lineage_acks.c.id)
        )
        if cluster is not None:
            q = q.where(lineages.c.cluster == cluster)
        with self.store.reading("read recent acknowledgements") as conn:
            return [(_key(r), _ack(r)) for r in conn.execute(q)]


def _key(r: Any) -> LineageKey:
    return LineageKey(r.cluster, r.namespace, r.lineage)


def _run(r: Any) -> LineageRun:
    return LineageRun(
        job=f"{r.job_kind}/{r.job_name}",
        verdict=r.verdict,
        start=r.start,
        end=r.end,
        uid=r.job_uid or None,
        findings=tuple(str(c) for c in (r.findings or ())),
        gpu_hours=r.gpu_hours,
        waste_gpu_hours=r.waste_gpu_hours,
        final=bool(r.final),
    )


def _ack(r: Any) -> Acknowledgement:
    return Acknowledgement(
        by=r.by, at=r.at, until=r.until, reason=r.reason or "", kind=AckKind(r.kind), via=r.via or "cli"
    )
