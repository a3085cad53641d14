"""Generated job history for the report tests: real buckets, real summaries, through the store.

Each job is a list of 5-minute buckets (30 s scrapes, 10 samples per bucket) of constant
activity, summarised by the real :func:`auditor.core.summary.summarize_job` and stored with the
real :class:`~auditor.store.Store` methods: the report reads exactly what an audit would write.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterable

from auditor.core.metrics import Metric
from auditor.core.mfu import MfuContext, MfuReference
from auditor.core.model import Bucket, JobRef, PodRef, Window
from auditor.core.summary import summarize_job
from auditor.store import Store
from auditor.traces import make_gpus

WIDTH = timedelta(minutes=5)
SAMPLES = 10  # per bucket: 30 s scrapes

#: activity profiles: metric → mean (absent metric: not exported)
PROFILES: dict[str, dict[Metric, float]] = {
    "healthy": {
        Metric.GPU_UTIL: 0.97,
        Metric.SM_ACTIVE: 0.82,
        Metric.TENSOR_ACTIVE: 0.45,
        Metric.DRAM_ACTIVE: 0.35,
        Metric.POWER: 600.0,
    },
    "low_sm": {
        Metric.GPU_UTIL: 1.0,
        Metric.SM_ACTIVE: 0.04,
        Metric.TENSOR_ACTIVE: 0.0,
        Metric.DRAM_ACTIVE: 0.01,
        Metric.POWER: 180.0,
    },
    "idle": {
        Metric.GPU_UTIL: 0.0,
        Metric.SM_ACTIVE: 0.0,
        Metric.TENSOR_ACTIVE: 0.0,
        Metric.DRAM_ACTIVE: 0.0,
        Metric.POWER: 90.0,
    },
    "underutilized": {
        Metric.GPU_UTIL: 0.35,
        Metric.SM_ACTIVE: 0.25,
        Metric.TENSOR_ACTIVE: 0.1,
        Metric.DRAM_ACTIVE: 0.1,
        Metric.POWER: 300.0,
    },
    "no_sm": {Metric.GPU_UTIL: 0.95, Metric.POWER: 500.0},
}
#: the MFU tests' profiles (issue 28), apart from :data:`PROFILES`, whose mix bench/report_bench.py
#: cycles through: an unfused bf16 transformer (tensor pipes ~16 % busy, DRAM busy), its fused twin
#: (~45 %), and a recommender's gathers (tensor pipes nearly idle, DRAM busy)
MFU_PROFILES: dict[str, dict[Metric, float]] = {
    "unfused": {
        Metric.GPU_UTIL: 0.99,
        Metric.SM_ACTIVE: 0.95,
        Metric.TENSOR_ACTIVE: 0.16,
        Metric.DRAM_ACTIVE: 0.58,
        Metric.POWER: 560.0,
    },
    "fused": {
        Metric.GPU_UTIL: 0.99,
        Metric.SM_ACTIVE: 0.93,
        Metric.TENSOR_ACTIVE: 0.45,
        Metric.DRAM_ACTIVE: 0.35,
        Metric.POWER: 650.0,
    },
    "gathers": {
        Metric.GPU_UTIL: 0.97,
        Metric.SM_ACTIVE: 0.80,
        Metric.TENSOR_ACTIVE: 0.02,
        Metric.DRAM_ACTIVE: 0.70,
        Metric.POWER: 500.0,
    },
}
#: the bf16 LLM training reference of issue 28 (auditor/core/mfu.py DEFAULT_CLASSES)
LLM_TRAINING = MfuReference(0.40, "llm-training")


@dataclass(frozen=True)
class GenJob:
    team: str
    name: str
    start: datetime
    hours: float
    gpus: int
    profile: str
    model: str = "NVIDIA H200"


def job_buckets(job: GenJob, pod: PodRef, host: str) -> list[Bucket]:
    """Buckets of ``job`` (start and length rounded to whole buckets)."""
    n = max(1, round(job.hours * 3600 / WIDTH.total_seconds()))
    out = []
    for gpu in make_gpus(job.gpus, host, model=job.model):
        for metric, value in (PROFILES.get(job.profile) or MFU_PROFILES[job.profile]).items():
            for i in range(n):
                s = job.start + i * WIDTH
                out.append(Bucket(pod, gpu, metric, s, s + WIDTH, value * SAMPLES, SAMPLES, value, value))
    return out


def store_jobs(store: Store, jobs: Iterable[GenJob], *, cluster: str = "c1", now: datetime) -> dict[str, dict]:
    """Write each job (buckets + summary); returns job name → its summary."""
    out = {}
    for k, job in enumerate(jobs):
        ref = JobRef(
            cluster=cluster, namespace=f"ns-{job.team}", kind="Job", name=job.name, uid=f"uid-{k}", team=job.team
        )
        pod = PodRef(ref.namespace, f"{job.name}-0", "main")
        buckets = job_buckets(job, pod, host=f"node-{k}")
        end = job.start + WIDTH * max(1, round(job.hours * 3600 / WIDTH.total_seconds()))
        summary = summarize_job(ref, buckets, window=Window(job.start, end), now=now, interval=30.0).to_json()
        job_id = store.upsert_job(ref, job.start, end)
        store.replace_buckets(job_id, buckets)
        store.save_summary(job_id, summary)
        out[job.name] = summary
    return out


def mfu_week(week_start: datetime) -> list[tuple[GenJob, MfuReference | None]]:
    """A week of the MFU tests: llm runs an unfused transformer (8 GPU-h), its fused twin (4 GPU-h)
    and an unfused one crossing the week's end (4 GPU-h, half in the week), all measured against
    the bf16 LLM training reference; recsys a recommender without a reference (6 GPU-h)."""
    return [
        (GenJob("llm", "gpt-unfused", week_start + timedelta(days=1), 2.0, 4, "unfused"), LLM_TRAINING),
        (GenJob("llm", "gpt-fused", week_start + timedelta(days=2), 1.0, 4, "fused"), LLM_TRAINING),
        (GenJob("llm", "gpt-crossing", week_start + timedelta(days=7, hours=-1), 2.0, 2, "unfused"), LLM_TRAINING),
        (GenJob("recsys", "dlrm", week_start + timedelta(days=3), 3.0, 2, "gathers"), None),
    ]


def store_mfu_jobs(
    store: Store, jobs: Iterable[tuple[GenJob, MfuReference | None]], *, cluster: str = "c1", now: datetime
) -> dict[str, dict]:
    """:func:`store_jobs` with each job's reference MFU given to the summarizer (as the engine
    gives it from the job's workload class); returns job name → its summary."""
    out = {}
    for k, (job, ref) in enumerate(jobs):
        jr = JobRef(cluster=cluster, namespace=f"ns-{job.team}", kind="Job", name=job.name, uid=f"u{k}", team=job.team)
        buckets = job_buckets(job, PodRef(jr.namespace, f"{job.name}-0", "main"), host=f"node-{k}")
        end = job.start + WIDTH * max(1, round(job.hours * 3600 / WIDTH.total_seconds()))
        summary = summarize_job(
            jr, buckets, window=Window(job.start, end), now=now, interval=30.0, mfu=MfuContext(reference=ref)
        ).to_json()
        job_id = store.upsert_job(jr, job.start, end)
        store.replace_buckets(job_id, buckets)
        store.save_summary(job_id, summary)
        out[job.name] = summary
    return out
