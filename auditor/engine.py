"""One audit: read a window from a source, attribute pods to jobs, store the rollup, summarize.

This is wiring, not logic: the math and the verdicts are in the core (:mod:`auditor.core.summary`
and its neighbours, pure), the reading in the source, the persistence in the store. With a store, the store's buckets are
the source of truth: the engine writes the window's buckets (idempotently), reads the job's
buckets back and summarizes those, so a summary never depends on which process read which part
of the history. Without a store (``store=None``) it summarizes the source's buckets directly.

Cumulative audits (the operator's cycles) summarize a job over its whole stored history without
reading it again: the store keeps each job's folded statistics (a
:class:`~auditor.core.accumulate.JobAggregate`), and a cycle folds in only its own buckets.
"""

from __future__ import annotations

import gc
import logging
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from itertools import groupby
from operator import attrgetter
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from auditor.clock import SYSTEM_CLOCK
from auditor.core.accumulate import JobAggregate, ShareMap, StaleFold
from auditor.core.job_summary import JobSummary, sorted_summaries
from auditor.core.mfu import (
    DEFAULT_CLASSES,
    SERVING_KINDS,
    MfuContext,
    MfuReference,
    WorkloadClass,
    reference_for,
    select_class,
)
from auditor.core.model import Bucket, JobRef, PodRef, Window
from auditor.core.readings import SourceReport
from auditor.core.rollup import LazyBuckets
from auditor.core.sharing import shared_gpus, shares_among
from auditor.core.summary import summarize_aggregate, summarize_job
from auditor.core.thresholds import Thresholds
from auditor.correlate import JobResolver, NoKubeResolver
from auditor.ports import MetricSource

if TYPE_CHECKING:
    from auditor.ports import Clock, Displacement, SummaryStore

__all__ = ["AuditResult", "JobResolver", "MfuPlan", "NoKubeResolver", "run_audit"]

log = logging.getLogger(__name__)

_POD = attrgetter("pod")
_START = attrgetter("start")
_END = attrgetter("end")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass
class AuditResult:
    """Per-job summaries (most waste first; ``to_json()`` is the audit JSON), what the source
    saw, the run's id."""

    summaries: list[JobSummary]
    report: SourceReport
    run_id: int | None


@dataclass(frozen=True)
class MfuPlan:
    """What each job's MFU is measured against (settings ``mfu:``, docs/operator.md; issue 28):
    the workload classes (first match wins; :data:`~auditor.core.mfu.DEFAULT_CLASSES` select by the
    job label ``gpu-auditor.io/workload-class``) and whether a lineage's best earlier run is a
    reference too. The lineage's runs come from a store that can read them
    (``lineage_best_mfu``, :meth:`auditor.store.Store.lineage_best_mfu`); without one, classes only.

    A plan that lives across audits (the operator's, one per process) keeps each job's lineage
    best for ``lineage_ttl`` of audit time: only runs that started before a job count, so its
    reference moves only as those runs' estimates do, and a cycle of thousands of jobs with long
    lineages need not read them all every five minutes (0.06–0.3 s per 1,000 jobs on SQLite)."""

    classes: tuple[WorkloadClass, ...] = DEFAULT_CLASSES
    lineage_best: bool = True
    lineage_ttl: timedelta = timedelta(hours=1)
    #: job key → (its lineage best or None, the audit ``now`` it was read at)
    _kept: dict[str, tuple[float | None, datetime]] = field(default_factory=dict, compare=False, repr=False)

    def lineage_bests(
        self, lookup: Callable[[Sequence[JobRef]], dict[str, float]], jobs: Sequence[JobRef], now: datetime
    ) -> dict[str, float]:
        """The lineage best of each of ``jobs`` that has one: kept values younger than
        ``lineage_ttl`` (by ``now``), the rest read with ``lookup`` in one call."""
        kept = self._kept
        for key in [k for k, (_v, at) in kept.items() if not now - self.lineage_ttl <= at <= now]:
            del kept[key]
        missing = [j for j in jobs if j.key not in kept]
        if missing:
            found = lookup(missing)
            kept.update((j.key, (found.get(j.key), now)) for j in missing)
        return {j.key: v for j in jobs if (v := kept[j.key][0]) is not None}


def _mfu_contexts(
    store: "SummaryStore | None", plan: MfuPlan, jobs: dict[str, JobRef], now: datetime
) -> dict[str, MfuContext]:
    """Each job's :class:`~auditor.core.mfu.MfuContext` by job key: its class's reference, or its
    lineage's best earlier MFU where that is higher (:func:`~auditor.core.mfu.reference_for`).

    The lineage lookup is one read for all jobs that can take it (a serving class or kind takes
    none: a server's MFU follows its traffic), batched in the store."""
    best: dict[str, float] = {}
    if store is not None and plan.lineage_best:
        wanted = [j for j in jobs.values() if not _serves(j, plan.classes)]
        best = plan.lineage_bests(store.lineage_best_mfu, wanted, now) if wanted else {}
    return {key: reference_for(job, plan.classes, best.get(key)) for key, job in jobs.items()}


def _serves(job: JobRef, classes: Sequence[WorkloadClass]) -> bool:
    """A serving kind or class: its MFU follows its traffic, so it has no lineage best."""
    cls = select_class(job, classes)
    return job.kind in SERVING_KINDS or (cls is not None and cls.serving)


def _kept_context(previous: dict, job: JobRef, plan: MfuPlan) -> MfuContext:
    """The MFU context of a job re-summarized from its stored state (:func:`_hand_over`): the
    reference its last summary was computed with (the stored job has no labels to select a
    class by), else its class's."""
    value, source = previous.get("mfu_reference"), previous.get("mfu_class")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(source, str) and value > 0:
        serving = any(c.serving for c in plan.classes if c.name == source)
        return MfuContext(MfuReference(min(1.0, float(value)), source), serving=serving)
    return reference_for(job, plan.classes, None)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a bulk read/summarize, then restore it.

    An audit creates millions of small objects (decoded JSON, buckets) that live until the end;
    with the collector on, every few hundred thousand allocations trigger a pass over all of
    them, which measured 3-5x the decoding time itself. Nothing here builds reference cycles
    that need the collector, and reference counting still frees everything as usual.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _lazy_shares(buckets: LazyBuckets) -> dict[tuple[str, datetime], int]:
    """:func:`~auditor.core.sharing.shared_gpus` of a lazy read: only GPUs that several pods
    used are made into bucket objects (on a cluster without sharing, none)."""
    pieces = buckets.pieces
    return shares_among(
        ((pod, key) for pod, key, _ in pieces),
        lambda keys: LazyBuckets.materialize(p for p in pieces if p[1] in keys),
    )


def align_down(t: datetime, width: timedelta) -> datetime:
    """The start of the ``width``-aligned bucket (since the epoch) that holds ``t``."""
    step = width.total_seconds()
    return datetime.fromtimestamp(t.timestamp() // step * step, timezone.utc)


def _hand_over(
    store: "SummaryStore",
    job_id: int,
    job: JobRef,
    displaced: "Sequence[Displacement]",
    report: SourceReport,
    *,
    now: datetime,
    interval: float | None,
    thresholds: Thresholds,
    plan: MfuPlan,
) -> None:
    """Say loudly that ``job``'s write met GPU time another job identity held (the store's
    ``replace_buckets`` settled it: :class:`~auditor.store.store.Displaced`), and re-summarize
    each other job that lost some from what it has left, so that no GPU-hour counts twice (no
    buckets left: its summary is dropped). Where ``job`` itself yielded, the caller summarizes
    what it kept.

    Two audits of one window with different resolvers (``--no-kube``: ``Pod/<name>``; through
    the API: the pod's job) name the same GPU time differently; the later one wins, unless it
    is a guess against an identity the API resolved.
    """
    by_job: dict[int, list[Displacement]] = defaultdict(list)
    for d in displaced:
        by_job[d.job_id].append(d)
    for loser_id, items in sorted(by_job.items()):
        pods = ", ".join(f"{d.namespace}/{d.pod}" for d in items)
        moved = sum(d.buckets for d in items)
        if loser_id == job_id:
            owners = sorted({(o.key if o else f"#{d.owner}") for d in items for o in [store.job(d.owner)]})
            msg = (
                f"GPU time of pod(s) {pods} is stored under job {', '.join(owners)}, resolved through the "
                f"Kubernetes API; not stored again as {job.key} ({moved} buckets left out): the same pods were "
                "audited under two job identities (e.g. --kubeconfig and --no-kube), and GPU time is counted once"
            )
            log.warning(msg)
            report.warnings.append(msg)
            continue
        other = store.job(loser_id)
        name = other.key if other is not None else f"#{loser_id}"
        msg = (
            f"GPU time of pod(s) {pods} was stored under job {name}; job {job.key} now owns it "
            f"({moved} buckets moved): the same pods were audited under two job identities "
            "(e.g. --no-kube and --kubeconfig), and GPU time is counted once, under the latest"
        )
        log.warning(msg)
        report.warnings.append(msg)
        rest = store.buckets(loser_id)
        if other is None or not rest:
            store.delete_summary(loser_id)
            continue
        span = Window(min(b.start for b in rest), max(b.end for b in rest))
        previous = store.summary(loser_id) or {}
        summary = summarize_job(
            other,
            rest,
            window=span,
            now=now,
            interval=interval,
            thresholds=thresholds,
            mfu=_kept_context(previous, other, plan),
        ).to_json()
        # what the engine does not compute (the operator's Kubernetes view, ``final``) stays
        store.save_summary(loser_id, {**{k: v for k, v in previous.items() if k not in summary}, **summary})


def _fold_cumulative(
    store: "SummaryStore",
    job_id: int,
    buckets: list[Bucket],
    shares: ShareMap,
    *,
    freeze_to: datetime,
    interval: float,
    now: datetime,
) -> JobAggregate:
    """The job's aggregate over all of its stored history, reading only what it lacks.

    The stored aggregate holds every bucket before its ``through``; the buckets of this window
    that start before ``freeze_to`` (the next window's start: no later cycle rewrites them) are
    folded into it and it is saved. The still-open buckets are folded into a copy, which is
    returned for the summary. A job without a usable aggregate (first seen, or older buckets
    rewritten since) is folded from its stored history once.
    """
    win_start = min(map(_START, buckets))
    done = [b for b in buckets if b.start < freeze_to]
    tail = [b for b in buckets if b.start >= freeze_to]
    agg = store.aggregate(job_id)
    if agg is None or agg.through is None or agg.through > win_start:
        agg, history = JobAggregate(), store.buckets(job_id, Window(_EPOCH, win_start))
    elif agg.through < win_start:  # cycles without samples of this job: whatever was stored since
        history = [b for b in store.buckets(job_id, Window(agg.through, win_start)) if b.start >= agg.through]
    else:
        history = []
    try:
        agg.fold(history + done, shares)
    except StaleFold as exc:
        log.warning("job %d: rebuilding its aggregate from the stored buckets (%s)", job_id, exc)
        agg = JobAggregate()
        agg.fold(store.buckets(job_id, Window(_EPOCH, freeze_to)), shares)
    agg.freeze(freeze_to)
    # what a source first told is kept for a job without full buckets: a later cycle's window
    # may hold only a partial bucket, and the source's estimate from it must not replace it
    agg.interval = agg.interval or interval
    store.save_aggregate(job_id, agg, now)
    if not tail:
        return agg
    view = agg.copy()
    view.fold(tail, shares)
    return view


#: at most this many buckets of a cycle are written (and held as objects) at once
_WRITE_GROUP = 50_000


def _written(
    store: "SummaryStore | None",
    by_job: dict[str, list],
    jobs: dict[str, JobRef],
    materialize: Callable[[list], list[Bucket]],
    window: Window,
    *,
    bulk: bool,
) -> Iterator[tuple[str, int | None, list[Bucket], "Sequence[Displacement]"]]:
    """Each job's buckets (in job key order) once the store holds them: its id and what its
    write displaced (no store: id None).

    ``bulk`` (the operator's cycle): the jobs are upserted and their buckets
    written a group at a time (one statement each for up to :data:`_WRITE_GROUP` buckets instead
    of several per job); the rows are the same as one write per job in order. Otherwise one
    job at a time, so only one job's buckets are objects at once.
    """
    keys = sorted(by_job)
    if store is None or not bulk:
        for key in keys:
            buckets = materialize(by_job.pop(key))
            if store is None:
                yield key, None, buckets, ()
                continue
            first, last = _span(buckets, window)
            job_id = store.upsert_job(jobs[key], first, last)
            yield key, job_id, buckets, store.replace_buckets(job_id, buckets)
        return
    group: list[tuple[str, list[Bucket]]] = []
    size = 0
    for n, key in enumerate(keys, 1):
        buckets = materialize(by_job.pop(key))
        group.append((key, buckets))
        size += len(buckets)
        if size < _WRITE_GROUP and n < len(keys):
            continue
        ids = store.upsert_jobs([(jobs[k], *_span(b, window)) for k, b in group])
        moved = store.replace_buckets_many(list(zip(ids, (b for _k, b in group))))
        yield from ((k, job_id, b, d) for (k, b), job_id, d in zip(group, ids, moved))
        group, size = [], 0


def _span(buckets: list[Bucket], window: Window) -> tuple[datetime, datetime]:
    """The first and last time of a job's buckets within the window (its stored span)."""
    return max(window.start, min(map(_START, buckets))), min(window.end, max(map(_END, buckets)))


def _cluster_of(resolver: JobResolver) -> dict[str, str]:
    """The run's cluster, for its record: retention prunes runs by cluster (several may share a store)."""
    return {"cluster": resolver.cluster} if resolver.cluster else {}


def run_audit(
    source: MetricSource,
    resolver: JobResolver,
    store: "SummaryStore | None",
    window: Window,
    *,
    now: datetime,
    thresholds: Thresholds | None = None,
    width: timedelta = timedelta(minutes=5),
    cumulative: bool = False,
    progress: Callable[[str], None] | None = None,
    clock: "Clock | None" = None,
    mfu: MfuPlan | None = None,
) -> AuditResult:
    """Audit ``window``: one source read, then per job store → read back → summarize → save.

    ``cumulative`` (store only): summarize each job over all of its stored buckets, not just
    those of this window — what the operator's periodic cycles report. ``progress`` receives
    short human-readable status lines (the CLI prints them on stderr). ``clock`` times the
    run's record (started, finished); ``now`` is the audit's instant (the summaries' ``now``).
    ``mfu``: what each job's MFU is measured against (default: the shipped classes and the
    lineage's best run, :class:`MfuPlan`).
    """
    with gc_paused():
        return _run_audit(
            source,
            resolver,
            store,
            window,
            now=now,
            thresholds=thresholds,
            width=width,
            cumulative=cumulative,
            progress=progress,
            clock=clock or SYSTEM_CLOCK,
            plan=mfu or MfuPlan(),
        )


def _run_audit(
    source: MetricSource,
    resolver: JobResolver,
    store: "SummaryStore | None",
    window: Window,
    *,
    now: datetime,
    thresholds: Thresholds | None,
    width: timedelta,
    cumulative: bool,
    progress: Callable[[str], None] | None,
    clock: "Clock",
    plan: MfuPlan,
) -> AuditResult:
    say = progress or (lambda _msg: None)
    started = clock.now()
    th = thresholds or Thresholds()
    try:
        say(f"reading {window.start.isoformat()} .. {window.end.isoformat()} ({width.total_seconds():.0f} s buckets)")
        # a source that can hand its buckets over lazily (the Prometheus source) keeps them as
        # compact arrays; each job's buckets become objects only while that job is handled
        result = source.read_lazy(window, width)
        report = result.report
        all_buckets = result.buckets
        del result
        runs: list[tuple[PodRef, list]]
        lazy = isinstance(all_buckets, LazyBuckets)
        if isinstance(all_buckets, LazyBuckets):
            runs = all_buckets.by_pod()
            materialize: Callable[[list], list[Bucket]] = LazyBuckets.materialize
            shares = _lazy_shares(all_buckets)
        else:
            # sources return buckets grouped by pod: walk pod runs rather than single buckets
            runs = [(pod, list(run)) for pod, run in groupby(all_buckets, key=_POD)]
            materialize = lambda parts: [b for part in parts for b in part]  # noqa: E731
            shares = shared_gpus(all_buckets)
        n_buckets = len(all_buckets)
        del all_buckets  # each job's buckets are freed once it is summarized
        pods = sorted({pod for pod, _ in runs})
        mapping = resolver.resolve(pods)
        unattributed = [p for p in pods if p not in mapping]
        if unattributed:
            report.warnings.append(
                f"{len(unattributed)} pod(s) could not be attributed to a job: "
                + ", ".join(f"{p.namespace}/{p.pod}" for p in unattributed[:10])
            )
        by_job: dict[str, list] = defaultdict(list)
        jobs: dict[str, JobRef] = {}
        for pod, run in runs:
            job = mapping.get(pod)
            if job is None:
                continue
            jobs.setdefault(job.key, job)
            if lazy:
                by_job[job.key].extend(run)  # pieces of a lazy read
            else:
                by_job[job.key].append(run)  # a list of buckets
        del runs
        interval = report.scrape_interval
        say(f"{n_buckets} buckets, {len(pods)} pods, {len(jobs)} jobs")
        contexts = _mfu_contexts(store, plan, jobs, now)
        summaries: list[JobSummary] = []
        freeze_to = align_down(window.end, width)
        for key, job_id, buckets, displaced in _written(store, by_job, jobs, materialize, window, bulk=cumulative):
            job, ctx = jobs[key], contexts[key]
            if store is None or job_id is None:
                summary = summarize_job(
                    job, buckets, window=window, now=now, interval=interval, thresholds=th, shares=shares, mfu=ctx
                )
                summaries.append(summary)
                continue
            if displaced:
                _hand_over(store, job_id, job, displaced, report, now=now, interval=interval, thresholds=th, plan=plan)
                if any(d.job_id == job_id for d in displaced):  # it yielded: what it kept is its own
                    buckets = store.buckets(job_id, Window(min(b.start for b in buckets), max(b.end for b in buckets)))
                    if not buckets:
                        continue
            if cumulative:
                agg = _fold_cumulative(
                    store, job_id, buckets, shares, freeze_to=freeze_to, interval=interval or 0.0, now=now
                )
                earliest = agg.earliest or window.start
                # the job's whole history tells its interval, not this cycle's window (which may
                # hold one partial bucket): the summary stays the same while the data does
                summary = summarize_aggregate(
                    job,
                    agg,
                    window=Window(min(window.start, earliest), window.end),
                    now=now,
                    interval=agg.interval_for(agg.interval),
                    thresholds=th,
                    mfu=ctx,
                )
            else:
                buckets = store.buckets(job_id, window)
                summary = summarize_job(
                    job, buckets, window=window, now=now, interval=interval, thresholds=th, shares=shares, mfu=ctx
                )
            store.save_job_summary(job_id, summary)
            summaries.append(summary)
        summaries = sorted_summaries(summaries)
        run_id = None
        if store is not None:
            verdicts: dict[str, int] = defaultdict(int)
            for s in summaries:
                verdicts[s.verdict.value] += 1
            run_id = store.record_run(
                window,
                started,
                clock.now(),
                jobs=len(summaries),
                queries=report.queries,
                status="ok" if not report.warnings else "ok_with_warnings",
                detail={
                    "verdicts": dict(sorted(verdicts.items())),
                    "present": sorted(m.value for m in report.present),
                    "dropped": {m.value: n for m, n in sorted(report.dropped.items(), key=lambda kv: kv[0].value)},
                    "labels": dict(report.labels),
                    "warnings": list(report.warnings),
                    "unattributed_pods": len(unattributed),
                    "width_s": width.total_seconds(),
                    "thresholds": th.as_dict(),
                    **_cluster_of(resolver),
                },
            )
        return AuditResult(summaries=summaries, report=report, run_id=run_id)
    except Exception as exc:
        if store is not None:
            try:
                store.record_run(
                    window,
                    started,
                    clock.now(),
                    jobs=0,
                    queries=0,
                    status="failed",
                    detail={"error": f"{type(exc).__name__}: {exc}", **_cluster_of(resolver)},
                )
            except Exception:  # the original error matters more than the bookkeeping
                log.warning("could not record the failed audit run", exc_info=True)
        raise
