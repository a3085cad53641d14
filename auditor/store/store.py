"""The store adapter: jobs, the per-GPU bucket rollup, job summaries and audit runs.

SQLite (a file in the user's data directory) by default, PostgreSQL by URL; the same code and
the same tests run on both. Every public method is one transaction: either all of its rows are
written or none, so bad input never leaves half a write behind or costs stored data. Every
database failure leaves as :class:`auditor.errors.StoreError` naming the (password-masked) URL
and the operation, ``retryable`` when a retry can help (a connection drop, a locked file).

:class:`Store` is the facade the rest of the code uses; each concern lives in its own module
and the facade hands each call to it:

===============================  ==============================================================
module                           holds
===============================  ==============================================================
:mod:`auditor.store.database`    engine and connection setup, migration, transactions, errors
:mod:`auditor.store.jobs`        the ``jobs`` table (identity, span, end)
:mod:`auditor.store.buckets`     the per-GPU bucket rollup (the fast write path)
:mod:`auditor.store.claims`      GPU claims: one owner per pod's GPU time
:mod:`auditor.store.aggregates`  folded statistics per job
:mod:`auditor.store.job_summaries`  the audit-JSON object per job and its indexed columns
:mod:`auditor.store.runs`        audit runs (the operator's cycle cursor)
===============================  ==============================================================
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from auditor.core.accumulate import JobAggregate
from auditor.core.job_summary import JobSummary
from auditor.core.model import Bucket, JobRef, Window
from auditor.errors import BadInput
from auditor.store.aggregates import Aggregates
from auditor.store.buckets import BucketRollup
from auditor.store.claims import Displaced as Displaced  # re-exported
from auditor.store.claims import GpuClaims
from auditor.store.database import MIGRATIONS_DIR as MIGRATIONS_DIR  # re-exported
from auditor.store.database import Database
from auditor.store.job_summaries import SummaryRecords
from auditor.store.jobs import JobRecords
from auditor.store.runs import AuditRuns
from auditor.store.summaries import SUMMARY_FIELDS as SUMMARY_FIELDS  # re-exported
from auditor.store.summaries import summary_columns as summary_columns  # re-exported


class Store:
    """Persistent state of the auditor. Open with :meth:`open`; safe to share between threads."""

    def __init__(self, engine: Engine, url: URL) -> None:
        """Wrap an engine; use :meth:`open`, which also brings the schema up to date."""
        self._init(Database(engine, url))

    def _init(self, db: Database) -> None:
        self._db = db
        self._engine = db.engine
        self.display_url = db.display_url
        self._jobs = JobRecords(db)
        self._buckets = BucketRollup(db, GpuClaims(db))
        self._aggregates = Aggregates(db)
        self._summaries = SummaryRecords(db)
        self._runs = AuditRuns(db)

    @classmethod
    def open(cls, url: str | None = None, *, read_only: bool = False) -> "Store":
        """Connect to the store at ``url`` and migrate its schema to this version's head; with
        ``read_only``, write nothing and only check the schema
        (:meth:`Database.open <auditor.store.database.Database.open>`)."""
        store = cls.__new__(cls)
        store._init(Database.open(url, read_only=read_only))
        return store

    def close(self) -> None:
        """Release all connections. The object must not be used afterwards."""
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.display_url!r})"

    # ------------------------------------------------------------------ jobs (store/jobs.py)

    def upsert_job(self, job: JobRef, first_seen: datetime, last_seen: datetime) -> int:
        """Insert the job or update it, and return its id (:meth:`JobRecords.upsert_job`)."""
        return self._jobs.upsert_job(job, first_seen, last_seen)

    def upsert_jobs(self, items: Sequence[tuple[JobRef, datetime, datetime]]) -> list[int]:
        """:meth:`upsert_job` of several jobs in one transaction (:meth:`JobRecords.upsert_jobs`)."""
        return self._jobs.upsert_jobs(items)

    def find_job(self, namespace: str, kind: str, name: str, cluster: str | None = None) -> tuple[int, JobRef] | None:
        """Look a job up by ``namespace/Kind/name`` (:meth:`JobRecords.find_job`)."""
        return self._jobs.find_job(namespace, kind, name, cluster)

    def job_count(self, cluster: str | None = None) -> int:
        """How many jobs the store holds (:meth:`JobRecords.job_count`)."""
        return self._jobs.job_count(cluster)

    def jobs_of_pod(self, namespace: str, pod: str, cluster: str | None = None) -> list[tuple[int, JobRef]]:
        """The jobs whose buckets come from pod ``namespace/pod`` (:meth:`JobRecords.jobs_of_pod`)."""
        return self._jobs.jobs_of_pod(namespace, pod, cluster)

    def job(self, job_id: int) -> JobRef | None:
        """The job stored under ``job_id``, or None."""
        return self._jobs.job(job_id)

    def open_jobs(self, cluster: str) -> list[tuple[int, JobRef, datetime, datetime]]:
        """Jobs of ``cluster`` without an end: ``(id, job, first_seen, last_seen)``."""
        return self._jobs.open_jobs(cluster)

    def set_job_ended(self, job_id: int, ended_at: datetime | None) -> None:
        """Record when a job ended (None: it runs again, e.g. new pods under the same name)."""
        self._jobs.set_job_ended(job_id, ended_at)

    # ------------------------------------------------------------------ buckets (store/buckets.py, claims.py)

    def replace_buckets(self, job_id: int, buckets: Sequence[Bucket]) -> list[Displaced]:
        """Write the buckets of one job, settling its GPU claims (:meth:`BucketRollup.replace_buckets`)."""
        return self._buckets.replace_buckets(job_id, buckets)

    def replace_buckets_many(self, items: Sequence[tuple[int, Sequence[Bucket]]]) -> list[list[Displaced]]:
        """:meth:`replace_buckets` of several jobs in one write (:meth:`BucketRollup.replace_buckets_many`)."""
        return self._buckets.replace_buckets_many(items)

    def buckets(self, job_id: int, window: Window | None = None) -> list[Bucket]:
        """The job's buckets (those overlapping ``window`` when given), in time order."""
        return self._buckets.buckets(job_id, window)

    # ------------------------------------------------------------------ aggregates (store/aggregates.py)

    def aggregate(self, job_id: int) -> JobAggregate | None:
        """The job's folded statistics, None when there are none or they are unreadable."""
        return self._aggregates.aggregate(job_id)

    def save_aggregate(self, job_id: int, agg: JobAggregate, now: datetime) -> None:
        """Store the job's folded statistics, replacing the previous ones."""
        self._aggregates.save_aggregate(job_id, agg, now)

    def save_aggregates(self, items: Sequence[tuple[int, JobAggregate]], now: datetime) -> None:
        """:meth:`save_aggregate` of several jobs in one statement (:meth:`Aggregates.save_aggregates`)."""
        self._aggregates.save_aggregates(items, now)

    def advance_aggregates(self, items: Sequence[tuple[int, datetime]], now: datetime) -> int:
        """The stored ``through`` of jobs moved on without their state (:meth:`Aggregates.advance_aggregates`)."""
        return self._aggregates.advance_aggregates(items, now)

    def aggregate_stamps(self, cluster: str) -> dict[int, tuple[datetime, datetime]]:
        """``(through, updated)`` of each stored aggregate of the cluster (:meth:`Aggregates.stamps`)."""
        return self._aggregates.stamps(cluster)

    # ------------------------------------------------------------------ summaries (store/job_summaries.py)

    def save_summary(self, job_id: int, summary: dict) -> None:
        """Store the audit-JSON object of one job, replacing the previous one
        (:meth:`SummaryRecords.save_summary`)."""
        self._summaries.save_summary(job_id, summary)

    def record_admission_facts(self, readings: Sequence[tuple[int, Any]], now: datetime) -> int:
        """Fold Kueue admission readings into the jobs' stored facts (:meth:`AdmissionStore.record
        <auditor.store.admissions.AdmissionStore.record>`)."""
        from auditor.store.admissions import AdmissionStore

        return AdmissionStore(self).record(readings, now)

    def save_job_summary(self, job_id: int, summary: JobSummary) -> None:
        """The engine's own summary, saved as its audit JSON document."""
        self.save_summary(job_id, summary.to_json())

    def save_summaries(self, items: Sequence[tuple[int, dict]]) -> None:
        """:meth:`save_summary` of several jobs in one transaction (:meth:`SummaryRecords.save_summaries`)."""
        self._summaries.save_summaries(items)

    def summaries(
        self,
        *,
        cluster: str | None = None,
        namespace: str | None = None,
        team: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[dict]:
        """Stored summaries, most wasteful first (:meth:`SummaryRecords.summaries`)."""
        return self._summaries.summaries(cluster=cluster, namespace=namespace, team=team, since=since, until=until)

    def delete_summary(self, job_id: int) -> bool:
        """Drop the job's summary (its GPU time went to another job); True if there was one."""
        return self._summaries.delete_summary(job_id)

    def summary(self, job_id: int) -> dict | None:
        """The stored summary of one job (for ``explain``), or None."""
        return self._summaries.summary(job_id)

    def lineage_best_mfu(self, jobs: Sequence[JobRef]) -> dict[str, float]:
        """By job key: the best MFU estimate of the other runs of each job's lineage that started
        before it (:func:`auditor.store.lineage_tables.lineage_best_mfu`); jobs without one are
        left out. The engine's lineage-best reference (issue 28)."""
        from auditor.core.lineage import LineageKey, lineage_of
        from auditor.store.lineage_tables import lineage_best_mfu

        # a run is recorded under the lineage label where the summary carries it (the operator's
        # cycle: ``kube.lineage``), else under the job's name (``audit``): a labelled job's
        # lineage is looked up both ways
        items: list[tuple[LineageKey, JobRef]] = []
        for j in jobs:
            keys = {lineage_of(j.namespace, j.name, labels=dict(j.labels), cluster=j.cluster)}
            keys.add(lineage_of(j.namespace, j.name, cluster=j.cluster))
            items.extend((k, j) for k in sorted(keys, key=str))
        if not items:
            return {}
        with self._db.reading(f"read the best MFU of {len(jobs)} job(s)' lineages") as conn:
            best = lineage_best_mfu(conn, items)
        out: dict[str, float] = {}
        for n, value in best.items():
            key = items[n][1].key
            out[key] = max(value, out.get(key, value))
        return out

    # ------------------------------------------------------------------ runs (store/runs.py) and retention

    def record_run(
        self,
        window: Window,
        started: datetime,
        finished: datetime,
        *,
        jobs: int,
        queries: int,
        status: str,
        detail: dict,
    ) -> int:
        """Record one audit (its window, timing, counts and outcome); returns the run id."""
        return self._runs.record_run(
            window, started, finished, jobs=jobs, queries=queries, status=status, detail=detail
        )

    def runs(self, *, limit: int = 100) -> list[dict]:
        """The latest audit runs, newest first (:meth:`AuditRuns.runs`)."""
        return self._runs.runs(limit=limit)

    def decision_log(self) -> Any:
        """The policies' escalation record on this store (:class:`auditor.store.decisions.DecisionStore`):
        how the policy runner gets its default record without importing the store."""
        from auditor.store.decisions import DecisionStore  # decisions imports this module

        return DecisionStore(self)

    def job_snoozes(self) -> Any:
        """The paused escalation ladders on this store (:class:`auditor.store.job_snoozes.JobSnoozeLog`,
        issue 30): how the policy runner reads them without importing the store."""
        from auditor.store.job_snoozes import JobSnoozeLog  # job_snoozes imports this module

        return JobSnoozeLog(self)

    def apply_retention(
        self, now: datetime, *, bucket_retention: timedelta, summary_retention: timedelta, cluster: str | None = None
    ) -> int:
        """Delete what has aged out at ``now`` for ``cluster`` (None: every cluster); return the
        number of rows deleted. The rules per table are :mod:`auditor.store.retention`'s."""
        from auditor.store.retention import Retention, prune

        for label, value in (("bucket_retention", bucket_retention), ("summary_retention", summary_retention)):
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise BadInput(f"{label} must be positive, got {value}")
        return prune(self, now, Retention(bucket_retention, summary_retention), cluster=cluster).total

    # ------------------------------------------------------------------ transactions (store/database.py)

    @contextmanager
    def reading(self, what: str) -> Iterator[Connection]:
        """A read transaction for the store's own modules (reports, decisions, retention, ...).

        ``what`` names the operation in the :class:`~auditor.errors.StoreError` raised on failure
        (with the URL and whether a retry can help); inside :meth:`batch` the batch's connection
        is used. A value refused inside with :class:`~auditor.store.values.Invalid` becomes a
        StoreError too.
        """
        with self._db.reading(what) as conn:
            yield conn

    @contextmanager
    def writing(self, what: str, *, own: bool = False) -> Iterator[Connection]:
        """A write transaction: committed when the block succeeds, rolled back when it raises.

        Same error mapping as :meth:`reading`; on SQLite it takes the write lock up front, and
        inside :meth:`batch` it is a savepoint, so a failed block undoes only itself. ``own``
        takes a transaction of its own even inside a batch, committed when the block ends: for
        a claim that must be durable before the side effect it guards runs (the decision log).
        """
        with self._db.writing(what, own=own) as conn:
            yield conn

    @contextmanager
    def checking(self, what: str) -> Iterator[None]:
        """Value checks outside a transaction: :class:`~auditor.store.values.Invalid` raised
        inside becomes the same StoreError as in :meth:`writing`, before any connection is taken."""
        with self._db.checking(what):
            yield

    @contextmanager
    def batch(self) -> Iterator["Store"]:
        """Run the calls made inside (on this thread) in one transaction, committed at the end
        (:meth:`Database.batch <auditor.store.database.Database.batch>`)."""
        with self._db.batch():
            yield self

    @property
    def is_sqlite(self) -> bool:
        """Whether the database is SQLite (some queries carry planner hints only it needs)."""
        return self._db.is_sqlite

    def insert(self, table: sa.Table) -> Any:
        """The dialect's ``INSERT`` for ``table``, with ``on_conflict_do_update/_nothing``."""
        return self._db.insert(table)
