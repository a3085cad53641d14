"""Replay a recorded trace's phases as labelled jobs (issue 28): each phase one pod on its own GPU,
its job carrying the workload class and kind the truth gives, summarized with the reference MFU
its class selects (:func:`auditor.core.mfu.reference_for` over the shipped classes). Shared by the
verdict tests of the old and the new recordings."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta, timezone

from auditor.core.mfu import CLASS_LABEL, DEFAULT_CLASSES, reference_for
from auditor.core.model import Bucket, JobRef, PodRef, Window
from auditor.core.summary import summarize_job
from auditor.core.thresholds import Thresholds
from auditor.sources.replay import ReplaySource
from auditor.traces import TraceJob, load_trace, make_gpus

END = datetime(2026, 11, 30, 12, 0, 7, tzinfo=timezone.utc)  # deliberately not bucket-aligned
HOUR = timedelta(hours=1)


def replay(
    trace_name: str,
    classes: dict[str, tuple[str | None, str]],
    *,
    interval_s: float = 5.0,
    thresholds: Thresholds | None = None,
) -> dict[str, dict]:
    """The audit JSON of every phase in ``classes`` (phase → (workload class or None, kind)),
    replayed for an hour at ``interval_s``."""
    trace = load_trace(trace_name)
    pods: dict[PodRef, JobRef] = {}
    jobs = []
    for phase, (klass, kind) in classes.items():
        pod = PodRef("bench", phase.replace("_", "-"))
        labels = ((CLASS_LABEL, klass),) if klass else ()
        pods[pod] = JobRef("c", "bench", kind, phase.replace("_", "-"), team="bench", labels=labels)
        jobs.append(TraceJob(pod, make_gpus(1, f"node-{phase}"), phase))
    src = ReplaySource([(trace, jobs)], end=END, duration=HOUR, interval=timedelta(seconds=interval_s))
    window = Window(END - 3 * HOUR, END)
    by_pod: dict[PodRef, list[Bucket]] = defaultdict(list)
    for b in src.read(window, timedelta(minutes=5)).buckets:
        by_pod[b.pod].append(b)
    out = {}
    for pod, job in pods.items():
        ctx = reference_for(job, DEFAULT_CLASSES, None)
        s = summarize_job(job, by_pod[pod], window=window, now=END, interval=interval_s, thresholds=thresholds, mfu=ctx)
        out[pod.pod.replace("-", "_")] = s.to_json()
    return out


def reason(summary: dict) -> str | None:
    """The first finding's reason (the advice it gives)."""
    return summary["findings"][0]["evidence"].get("reason") if summary["findings"] else None
