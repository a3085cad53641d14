"""One operator cycle: from the previous cycle's end to now, into the store's rollup.

A cycle's cost follows the new samples, not the age of the jobs:

* the window starts where the previous successful cycle of this cluster ended (read back from the
  store's audit runs, so a restart or a new leader resumes there), aligned down to a bucket so the
  still-open bucket is re-read whole and replaced (the store's upsert is idempotent);
* the first cycle of a cluster (no cursor yet) starts where its oldest running job started, so
  every job's history is read from its start; later jobs start after the cursor, and a job that
  was running unnoticed (e.g. not resolvable yet) had its samples read by the cycles anyway;
* a gap (an outage, a restart) is caught up in chunks of ``catch_up_chunk``, never skipped;
  nothing older than ``max_lookback`` is read;
* each chunk is one store transaction, committed only if this process is still the leader at the
  end, so a cycle that lost its lease leaves nothing behind for the new leader to repeat.

Summaries are cumulative over every stored bucket of a job (``run_audit(cumulative=True)``): the
buckets before this window are not read again but come folded in the job's stored aggregate
(auditor.core.accumulate; the buckets before the next window's start are folded in at the end of
each cycle). Summaries carry the Kubernetes view (``kube``: Workload, queues, pods) and ``final``. A job whose pods all
finished or were deleted gets its final summary in the first cycle that ends ``end_settle``
after its end (late scrapes included), and ``jobs.ended_at`` is set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Protocol, Sequence

from auditor.clock import SYSTEM_CLOCK
from auditor.core.accumulate import JobAggregate
from auditor.core.identity import JobKey, Quarantine
from auditor.core.job_summary import JobSummary, sorted_summaries
from auditor.core.model import Bucket, JobRef, PodRef, Window
from auditor.core.rfc3339 import format_rfc3339, parse_rfc3339
from auditor.core.shards import WHOLE, Shard
from auditor.engine import MfuPlan, align_down, run_audit
from auditor.errors import AuditorError
from auditor.kube.resolver import JobInfo
from auditor.operator_loop.admissions import record_admissions
from auditor.ports import Clock, Displacement, MetricSource, OperatorStore

log = logging.getLogger(__name__)

ORIGIN = "operator"
#: how long after a job's end its final summary waits for late samples
END_SETTLE = timedelta(minutes=1)
#: a kept job aggregate's state is written whole at least this often (of its ``through``)
STATE_EVERY = timedelta(hours=1)
#: a chunk's summaries are written this many at a time (not all at its end: fewer documents held)
_SUMMARY_GROUP = 250


class LostLeadership(AuditorError):
    """The lease lapsed during a cycle: its writes are rolled back."""


class ClusterJobs(Protocol):
    """What a cycle asks of the cluster's job view (:class:`auditor.kube.resolver.KubeResolver`,
    or one shard's part of it, :class:`auditor.operator_loop.shards.ShardResolver`): the jobs
    with GPU pods now, which job each read pod belongs to, and the Kueue Workloads its admission
    facts come from."""

    @property
    def cluster(self) -> str:
        """The cluster its jobs belong to."""
        ...

    @property
    def rejected(self) -> Quarantine:
        """The last :meth:`resolve`'s pods whose owner no job key can hold."""
        ...

    @property
    def workloads(self) -> Any:
        """The Kueue Workloads informer; None where Kueue is off or not installed."""
        ...

    def jobs(self, now: datetime | None = None) -> dict[str, JobInfo]: ...

    def resolve(self, pods: Iterable[PodRef]) -> dict[PodRef, JobRef]: ...

    def forget(self, job: JobInfo) -> None: ...


def _job_key_of(summary: dict) -> str:
    return str(JobKey.of_document(summary))


@dataclass
class CycleResult:
    window: Window
    #: the summaries the cycle wrote (as stored: with the operator's ``final``/``ended`` and
    #: ``kube`` in ``extra``), most waste first
    summaries: list[JobSummary] = field(default_factory=list)
    #: what the policies decided on those summaries (auditor.policy.runner.Decision)
    decisions: list = field(default_factory=list)
    jobs_seen: int = 0
    finalized: list[str] = field(default_factory=list)
    chunks: int = 0
    queries: int = 0
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: series (and pods of owners) refused for an identity no Kubernetes object could have:
    #: never a job, counted in ``gpu_auditor_series_rejected_total{reason}``
    rejected: Quarantine = field(default_factory=Quarantine)


class _CycleStore:
    """The store as the engine sees it during a cycle: summaries get the Kubernetes view and
    ``final``; runs get ``origin``/``cluster``/``holder`` (the cursor is read back from them).

    The chunk's summaries and aggregates are written together when the engine records its run
    (one statement per table instead of several per job; the chunk is one transaction anyway),
    or earlier where a read or delete of one must see them. Aggregates come from the runner's
    copies where the store's stamp says they are what it holds (:class:`_KeptAggregates`).
    """

    def __init__(
        self,
        store: OperatorStore,
        view: dict[str, JobInfo],
        *,
        cycle_end: datetime,
        settle: timedelta,
        detail: dict,
        kept: "_KeptAggregates",
    ) -> None:
        self._store = store
        self._view = view
        self._cycle_end = cycle_end
        self._settle = settle
        self._detail = detail
        self._kept = kept
        self.saved: dict[str, tuple[int, dict]] = {}
        #: the engine's own summaries of ``saved`` (None where another writer's document was saved)
        self.made: dict[str, JobSummary | None] = {}
        self._summaries: dict[int, tuple[str, dict]] = {}  # pending: job id -> (job key, document)
        self._aggregates: dict[int, JobAggregate] = {}
        self._aggregates_now: datetime | None = None

    # what the engine reads, and the job rows it writes, are the store's own

    def upsert_job(self, job: JobRef, first_seen: datetime, last_seen: datetime) -> int:
        return self._store.upsert_job(job, first_seen, last_seen)

    def upsert_jobs(self, items: Sequence[tuple[JobRef, datetime, datetime]]) -> list[int]:
        return self._store.upsert_jobs(items)

    def job(self, job_id: int) -> JobRef | None:
        return self._store.job(job_id)

    def buckets(self, job_id: int, window: Window | None = None) -> list[Bucket]:
        return self._store.buckets(job_id, window)

    def lineage_best_mfu(self, jobs: Sequence[JobRef]) -> dict[str, float]:
        return self._store.lineage_best_mfu(jobs)

    # what it writes of summaries and aggregates waits for the chunk's group writes

    def save_summary(self, job_id: int, summary: dict) -> None:
        self._save(job_id, summary, None)

    def save_job_summary(self, job_id: int, summary: JobSummary) -> None:
        """What the engine saves of its own summaries: the document, and the object kept so
        that the cycle's result need not read the document back."""
        self._save(job_id, summary.to_json(), summary)

    def _save(self, job_id: int, doc: dict, made: JobSummary | None) -> None:
        key = _job_key_of(doc)
        enrich(doc, self._view.get(key), self._cycle_end, self._settle)
        self._summaries.pop(job_id, None)
        self._summaries[job_id] = (key, doc)
        self.saved[key] = (job_id, doc)
        self.made[key] = made
        if len(self._summaries) >= _SUMMARY_GROUP:
            self._flush_summaries()

    def save_aggregate(self, job_id: int, agg: JobAggregate, now: datetime) -> None:
        if self._aggregates_now is not None and self._aggregates_now != now:
            self.flush()
        self._aggregates_now = now
        self._aggregates.pop(job_id, None)
        self._aggregates[job_id] = agg

    def aggregate(self, job_id: int) -> JobAggregate | None:
        if job_id in self._aggregates:
            self.flush()
        kept = self._kept.take(job_id)
        return kept if kept is not None else self._store.aggregate(job_id)

    def summary(self, job_id: int) -> dict | None:
        self.flush()
        return self._store.summary(job_id)

    def delete_summary(self, job_id: int) -> bool:
        self.flush()
        return bool(self._store.delete_summary(job_id))

    def replace_buckets(self, job_id: int, buckets: Sequence[Bucket]) -> Sequence[Displacement]:
        displaced = self._store.replace_buckets(job_id, buckets)
        self._displaced(job_id, displaced)
        return displaced

    def replace_buckets_many(self, items: Sequence[tuple[int, Sequence[Bucket]]]) -> Sequence[Sequence[Displacement]]:
        moved = self._store.replace_buckets_many(items)
        for (job_id, _buckets), displaced in zip(items, moved):
            self._displaced(job_id, displaced)
        return moved

    def _displaced(self, job_id: int, displaced: Sequence[Displacement]) -> None:
        """The store deleted the losers' aggregates with their buckets: neither a pending nor a
        kept copy may bring one back."""
        if displaced:
            for d in displaced:
                for other in (d.job_id, d.owner):
                    self._aggregates.pop(other, None)
                    self._kept.forget(other)
            self._kept.forget(job_id)

    def flush(self) -> None:
        """Write the pending summaries and aggregates (one statement per table)."""
        if self._aggregates:
            items = list(self._aggregates.items())
            self._aggregates.clear()
            now = self._aggregates_now
            assert now is not None
            write, advance = self._kept.split(items)
            if write:
                self._store.save_aggregates(write, now)
            if advance:
                self._store.advance_aggregates(
                    [(job_id, agg.through) for job_id, agg in advance if agg.through is not None], now
                )
            self._kept.saved(write, advance, now)
        self._flush_summaries()

    def _flush_summaries(self) -> None:
        """Write the pending summaries; of those the engine made, only what :func:`_as_stored`
        and the cycle read is kept of the document (a 10-GPU job's is ~40 KiB as Python
        objects, and the summary object holds the rest)."""
        if not self._summaries:
            return
        pending = list(self._summaries.items())
        self._summaries.clear()
        self._store.save_summaries([(job_id, doc) for job_id, (_key, doc) in pending])
        for job_id, (key, doc) in pending:
            made = self.made.get(key)
            if made is not None and not made.extra and self.saved[key][1] is doc:
                self.saved[key] = (job_id, {k: doc[k] for k in _STORED_FIELDS if k in doc})

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
        if status == "failed":  # the chunk's transaction is rolled back: nothing to add
            self._summaries.clear()
            self._aggregates.clear()
        else:
            self.flush()
        return self._store.record_run(
            window, started, finished, jobs=jobs, queries=queries, status=status, detail={**detail, **self._detail}
        )


class _KeptAggregates:
    """The job aggregates this runner saved, kept between cycles so that a steady cycle does not
    read and decode each job's aggregate again. The store stays the truth: a kept copy is used
    only while the store's ``(through, updated)`` of the job is still the one it was saved with
    (read for all jobs of the cluster in one query per chunk), so one that another process wrote
    or deleted since, a rolled-back cycle's, or one lost with a displacement is read again.

    A kept aggregate's state is written to the store at most every :data:`STATE_EVERY` of its
    ``through``; in the cycles between, only the stored ``through`` and stamp move
    (``advance_aggregates``), since serializing every job's state each cycle was a tenth of a
    steady cycle. Whoever reads the stored state (a restart, a new leader or shard) folds the
    buckets after the state's own ``through`` from the store, at most that much; and a rewrite
    of a bucket the kept copy holds still deletes the row by the moved ``through``, which ends
    the copy here too. An aggregate not continued from the kept copy (read from the store,
    rebuilt), and one with a GPU shared with other pods, is always written whole: a reader folds
    stored buckets without the other pods' shares of them (those come from a cycle's read), so
    only an aggregate that never saw sharing folds on exactly from an older state."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[tuple[datetime, datetime], JobAggregate]] = {}
        self._stamps: dict[int, tuple[datetime, datetime]] = {}
        #: the ``through`` of the state last written whole, per kept job
        self._state: dict[int, datetime] = {}
        #: the kept copies handed out this chunk (a saved aggregate that is one of them continues it)
        self._taken: dict[int, JobAggregate] = {}

    def check(self, store: OperatorStore, cluster: str) -> None:
        """Read the store's stamps (inside the chunk's transaction, before its writes)."""
        self._stamps = store.aggregate_stamps(cluster) if self._kept else {}
        self._taken.clear()

    def take(self, job_id: int) -> JobAggregate | None:
        """The kept aggregate of the job when the store still holds it (the caller may change it:
        it is no longer kept until saved again)."""
        entry = self._kept.pop(job_id, None)
        if entry is None or self._stamps.get(job_id) != entry[0]:
            self._state.pop(job_id, None)
            return None
        self._taken[job_id] = entry[1]
        return entry[1]

    def forget(self, job_id: int) -> None:
        self._kept.pop(job_id, None)
        self._state.pop(job_id, None)
        self._taken.pop(job_id, None)

    def split(
        self, items: list[tuple[int, JobAggregate]]
    ) -> tuple[list[tuple[int, JobAggregate]], list[tuple[int, JobAggregate]]]:
        """The aggregates to write whole, and those whose stored ``through`` only moves."""
        write: list[tuple[int, JobAggregate]] = []
        advance: list[tuple[int, JobAggregate]] = []
        for job_id, agg in items:
            state = self._state.get(job_id)
            if (
                state is not None
                and agg.through is not None
                and self._taken.get(job_id) is agg
                and agg.through - state < STATE_EVERY
                and all(row.max_share <= 1 for row in agg.rows.values())
            ):
                advance.append((job_id, agg))
            else:
                write.append((job_id, agg))
        return write, advance

    def saved(
        self, write: list[tuple[int, JobAggregate]], advance: list[tuple[int, JobAggregate]], now: datetime
    ) -> None:
        for job_id, agg in write:
            if agg.through is not None:
                self._kept[job_id] = ((agg.through, now), agg)
                self._state[job_id] = agg.through
        for job_id, agg in advance:
            if agg.through is not None:
                self._kept[job_id] = ((agg.through, now), agg)

    def clear(self) -> None:
        self._kept.clear()
        self._state.clear()
        self._taken.clear()


def _as_stored(made: JobSummary | None, doc: dict) -> JobSummary:
    """The summary as stored (``doc``): the engine's object with what :func:`enrich` added to its
    document (the same as ``JobSummary.from_json(doc)``, without reading it all back), or
    ``doc`` read back where the engine did not make it (a final summary, a hand-over)."""
    if made is None or made.extra or doc.get("verdict") != made.verdict.value:
        return JobSummary.from_json(doc)
    ended = doc.get("ended")
    return replace(
        made,
        queue=doc.get("queue"),
        final=doc.get("final"),
        ended=parse_rfc3339(ended) if ended is not None else None,
        extra={k: doc[k] for k in _ENRICHED_EXTRA if k in doc},
    )


#: what :func:`enrich` adds to a document beyond JobSummary's own fields
_ENRICHED_EXTRA = ("kube",)
#: what the cycle reads of a written document of the engine's own summary (:func:`_as_stored`,
#: ``final`` for reopening and ending jobs)
_STORED_FIELDS = ("verdict", "queue", "final", "ended", *_ENRICHED_EXTRA)


def enrich(summary: dict, info: JobInfo | None, cycle_end: datetime, settle: timedelta) -> None:
    """Add what Kubernetes says about the job to its audit-JSON summary (in place)."""
    if info is not None:
        summary["kube"] = info.as_json()
        if info.workload or info.local_queue:
            summary["queue"] = info.local_queue
        ended = info.ended
        summary["final"] = bool(ended is not None and ended <= cycle_end - settle)
        summary["ended"] = format_rfc3339(ended) if summary["final"] and ended else None
    else:
        summary.setdefault("final", False)
        summary.setdefault("ended", None)


class CycleRunner:
    """Runs cycles for one cluster against one store, source and resolver."""

    def __init__(
        self,
        *,
        store: OperatorStore,
        source: MetricSource,
        resolver: ClusterJobs,
        cluster: str,
        width: timedelta = timedelta(minutes=5),
        max_lookback: timedelta = timedelta(days=7),
        catch_up_chunk: timedelta = timedelta(hours=6),
        end_settle: timedelta = END_SETTLE,
        holder: str = "",
        dry_run: bool = False,
        still_leader: Callable[[], bool] = lambda: True,
        thresholds: Any = None,
        clock: Clock = SYSTEM_CLOCK,
        shard: Shard = WHOLE,
        mfu: MfuPlan | None = None,
    ) -> None:
        self.store = store
        self.source = source
        self.resolver = resolver
        self.cluster = cluster
        self.width = width
        self.max_lookback = max_lookback
        self.catch_up_chunk = catch_up_chunk
        self.end_settle = end_settle
        self.holder = holder
        #: a dry run (``run --dry-run``) keeps its own cursor: it never moves the acting operator's
        self.dry_run = dry_run
        self.still_leader = still_leader
        self.thresholds = thresholds
        #: what each job's MFU is measured against (settings ``mfu:``; None: the shipped classes)
        self.mfu = mfu
        #: "now" when ``run`` is given none, and the cycle's timing
        self.clock = clock
        self._covered: set[str] = set()  # job keys whose history this process has read
        self._kept = _KeptAggregates()
        #: what the log said was refused last (:meth:`_say_rejected`)
        self._rejected_said: tuple[dict, dict] = ({}, {})
        #: which namespaces this runner audits (auditor.core.shards); its runs carry the shard,
        #: so each shard continues from its own cursor and ends only its own jobs
        self.shard = shard
        self._shard_label = shard.label if shard.sharded else None

    # ------------------------------------------------------------------ cursor

    def cursor(self) -> datetime | None:
        """End of this cluster's last successful operator cycle, aligned down to a bucket."""
        for run in self.store.runs(limit=500):
            d = run.get("detail") or {}
            if (
                d.get("origin") == ORIGIN
                and d.get("cluster") == self.cluster
                and bool(d.get("dry_run")) == self.dry_run
                and d.get("shard") == self._shard_label
                and str(run.get("status", "")).startswith("ok")
            ):
                return align_down(run["window_end"], self.width)
        return None

    def plan(self, now: datetime, view: dict[str, JobInfo]) -> Window:
        """The window this cycle reads (see the module docstring).

        With a cursor, the cycle continues from it: every sample since the first cycle has been
        read by some cycle (each reads every pod's series in its window), so a job first seen
        now that started earlier needs nothing older. The very first cycle of a cluster reads
        back to the start of its oldest running job, at most ``max_lookback``.
        """
        floor = align_down(now - self.max_lookback, self.width)
        cursor = self.cursor()
        if cursor is not None:
            start = cursor
        else:
            starts = [j.start for j in view.values() if j.start is not None]
            start = min(starts) if starts else now - self.width
        start = max(align_down(start, self.width), floor)
        if start >= now:
            start = align_down(now - self.width, self.width)
        return Window(start, now)

    def chunks(self, window: Window) -> list[Window]:
        step = max(self.width, (self.catch_up_chunk // self.width) * self.width)
        out, t = [], window.start
        while t < window.end:
            out.append(Window(t, min(t + step, window.end)))
            t += step
        return out

    # ------------------------------------------------------------------ cycle

    def run(self, now: datetime | None = None) -> CycleResult:
        t0 = self.clock.monotonic()
        now = now or self.clock.now()
        view = self.resolver.jobs(now)
        open_jobs = {
            ref.key: (job_id, ref, last_seen)
            for job_id, ref, _first, last_seen in self.store.open_jobs(self.cluster)
            if self.shard.owns(ref.namespace)
        }
        window = self.plan(now, view)
        result = CycleResult(window=window, jobs_seen=len(view))
        log.info(
            "cycle %s → %s: %d GPU job(s) in the cluster",
            format_rfc3339(window.start),
            format_rfc3339(window.end),
            len(view),
        )
        detail = {
            "origin": ORIGIN,
            "cluster": self.cluster,
            "holder": self.holder,
            **({"dry_run": True} if self.dry_run else {}),
            **({"shard": self._shard_label} if self._shard_label else {}),
        }
        touched: dict[str, tuple[int, dict]] = {}
        summaries: dict[str, JobSummary] = {}  # the engine's own of ``touched``, by job key
        owners = Quarantine()  # the read's pods whose owner's name no job key can hold
        for chunk in self.chunks(window):
            proxy = _CycleStore(self.store, view, cycle_end=now, settle=self.end_settle, detail=detail, kept=self._kept)
            with self.store.batch():
                self._kept.check(self.store, self.cluster)
                audit = run_audit(  # proxy is a SummaryStore (auditor.ports), as run_audit asks
                    self.source,
                    self.resolver,
                    proxy,
                    chunk,
                    now=now,
                    width=self.width,
                    cumulative=True,
                    thresholds=self.thresholds,
                    clock=self.clock,
                    mfu=self.mfu,
                )
                self._reopen(proxy.saved, open_jobs)
                if not self.still_leader():
                    raise LostLeadership("the Lease was lost during the cycle; its writes are rolled back")
            for key, made in proxy.made.items():
                if made is not None:
                    summaries[key] = made
            result.chunks += 1
            result.queries += audit.report.queries
            result.warnings.extend(audit.report.warnings)
            result.rejected.most(audit.report.rejected)  # one hostile series is in every chunk's read
            owners.most(self.resolver.rejected)  # pods of refused owners
            touched.update(proxy.saved)
        if owners:
            result.rejected.most(owners)
            result.warnings.extend(owners.lines("pods"))
        # every stored job still open, not only those with new samples: an evicted job waiting
        # for re-admission sends none, and that is when its Workload changes
        known = {k: job_id for k, (job_id, _ref, _seen) in open_jobs.items()}
        known.update({k: job_id for k, (job_id, _s) in touched.items()})
        with self.store.batch():
            record_admissions(self.store, self.resolver, view, known, now)
            if not self.still_leader():
                raise LostLeadership("the Lease was lost during the cycle; its writes are rolled back")
        result.finalized = self._finalize(now, view, open_jobs, touched)
        self._covered = set(view)
        result.summaries = sorted_summaries([_as_stored(summaries.get(k), doc) for k, (_id, doc) in touched.items()])
        result.seconds = self.clock.monotonic() - t0
        self._say_rejected(result.rejected)
        return result

    def _say_rejected(self, rejected: Quarantine) -> None:
        """The refused series named in the log once, not every cycle: again only when what is
        refused changes (the counter says how many each cycle)."""
        said = (rejected.counts, rejected.named)
        if said == self._rejected_said:
            return
        self._rejected_said = said
        for line in rejected.lines():
            log.warning("quarantined: %s", line)

    def _reopen(self, saved: dict[str, tuple[int, dict]], open_jobs: dict) -> None:
        """A running job that the store had as ended (same name, new pods) is open again."""
        for key, (job_id, summary) in saved.items():
            if key not in open_jobs and key not in self._covered and not summary.get("final"):
                self.store.set_job_ended(job_id, None)

    def _finalize(self, now: datetime, view: dict[str, JobInfo], open_jobs: dict, touched: dict) -> list[str]:
        """Mark ended jobs final: their summary gets ``final: true`` and the job its ``ended_at``."""
        done: list[str] = []
        settle_before = now - self.end_settle
        with self.store.batch():
            for key, (job_id, summary) in touched.items():
                if summary.get("final"):
                    ended = view[key].ended if key in view else None
                    self.store.set_job_ended(job_id, ended or now)
                    done.append(key)
            for key, (job_id, _ref, last_seen) in open_jobs.items():
                if key in touched:
                    continue
                info = view.get(key)
                if info is not None:
                    ended = info.ended
                    if ended is None or ended > settle_before:
                        continue
                elif last_seen > now - self.width - self.end_settle:
                    continue  # gone from the API, but samples came in recently: wait
                else:
                    ended = last_seen
                summary = self.store.summary(job_id)
                if summary is not None:
                    if info is not None:
                        summary["kube"] = info.as_json()
                    summary["final"] = True
                    summary["ended"] = format_rfc3339(ended)
                    self.store.save_summary(job_id, summary)
                    touched[key] = (job_id, summary)
                self.store.set_job_ended(job_id, ended)
                done.append(key)
            if not self.still_leader():
                raise LostLeadership("the Lease was lost during the cycle; its writes are rolled back")
        for key in done:
            if key in view:
                self.resolver.forget(view[key])
        if done:
            log.info("final summaries: %s", ", ".join(done))
        return done
