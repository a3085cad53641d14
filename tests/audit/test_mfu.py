"""The MFU reference (issue 28): workload classes selected by labels, namespace, team and
PriorityClass; the lineage's own best run; recoverable GPU-hours; and the ``low_mfu`` verdict
that follows from them."""

from datetime import datetime, timedelta, timezone

import pytest
from test_classify import ev

from auditor.core.metrics import Metric
from auditor.core.mfu import (
    CLASS_LABEL,
    DEFAULT_CLASSES,
    LINEAGE_BEST,
    MfuContext,
    MfuReference,
    WorkloadClass,
    recoverable_gpu_hours,
    reference_for,
    select_class,
)
from auditor.core.model import JobRef, Verdict
from auditor.core.thresholds import Thresholds
from auditor.core.verdicts import Evidence, classify


def job(**kw) -> JobRef:
    base = dict(cluster="c", namespace="ml", kind="PyTorchJob", name="train", team="llm")
    base.update(kw)
    return JobRef(**base)


def labelled(cls: str, **kw) -> JobRef:
    return job(labels=((CLASS_LABEL, cls),), **kw)


def test_default_classes_are_selected_by_the_workload_class_label():
    assert select_class(labelled("llm-training"), DEFAULT_CLASSES).name == "llm-training"
    assert select_class(labelled("cnn-training"), DEFAULT_CLASSES).reference_mfu is None
    assert select_class(labelled("llm-inference"), DEFAULT_CLASSES).serving
    assert select_class(job(), DEFAULT_CLASSES) is None
    assert select_class(labelled("something-else"), DEFAULT_CLASSES) is None


def test_every_non_empty_selector_must_match():
    c = WorkloadClass(
        "big-llm",
        0.45,
        namespaces=("ml-*",),
        teams=("llm",),
        labels=(("app", "gpt-*"),),
        priority_classes=("train*",),
    )
    ok = job(namespace="ml-prod", labels=(("app", "gpt-7b"),), priority_class="training")
    assert c.matches(ok)
    assert not c.matches(job(namespace="other", labels=(("app", "gpt-7b"),), priority_class="training"))
    assert not c.matches(
        job(namespace="ml-prod", team="vision", labels=(("app", "gpt-7b"),), priority_class="training")
    )
    assert not c.matches(job(namespace="ml-prod", labels=(("app", "bert"),), priority_class="training"))
    assert not c.matches(job(namespace="ml-prod", labels=(("app", "gpt-7b"),)))
    # a team-less job's team is its namespace (as the summary says)
    assert WorkloadClass("t", 0.4, teams=("ml",)).matches(job(team=""))
    # no selector: every job
    assert WorkloadClass("all", 0.3).matches(job())


def test_first_matching_class_wins():
    classes = (WorkloadClass("a", 0.3, namespaces=("ml",)), WorkloadClass("b", 0.5))
    assert select_class(job(), classes).name == "a"
    assert select_class(job(namespace="x"), classes).name == "b"


def test_reference_mfu_must_be_a_ratio():
    with pytest.raises(ValueError):
        WorkloadClass("bad", 0.0)
    with pytest.raises(ValueError):
        WorkloadClass("bad", 1.5)


@pytest.mark.parametrize(
    "ref, lineage, want",
    [
        ("llm-training", None, MfuReference(0.40, "llm-training")),
        ("llm-training", 0.30, MfuReference(0.40, "llm-training")),  # class above the lineage
        ("llm-training", 0.47, MfuReference(0.47, LINEAGE_BEST)),  # the lineage did better once
        ("cnn-training", 0.20, MfuReference(0.20, LINEAGE_BEST)),  # no class reference: the lineage's
        ("cnn-training", None, None),  # no class reference, no history: never charged
        (None, None, None),
        ("llm-inference", 0.5, None),  # a server's best hour says nothing about its code
    ],
)
def test_reference_is_the_higher_of_class_and_lineage(ref, lineage, want):
    j = labelled(ref) if ref else job()
    ctx = reference_for(j, DEFAULT_CLASSES, lineage)
    assert ctx.reference == want
    assert ctx.serving == (ref == "llm-inference")


def test_recoverable_gpu_hours():
    assert recoverable_gpu_hours(10.0, 0.16, 0.40) == pytest.approx(6.0)
    assert recoverable_gpu_hours(10.0, 0.50, 0.40) == 0.0  # above the reference: nothing to recover
    assert recoverable_gpu_hours(None, 0.16, 0.40) is None
    assert recoverable_gpu_hours(10.0, None, 0.40) is None
    assert recoverable_gpu_hours(10.0, 0.16, None) is None


def founding_case(**kw) -> Evidence:
    """The issue's founding case: utilization ~99 %, SM ~95 %, tensor ~17 %, DRAM ~57 %, MFU ~0.16."""
    base = dict(busy=0.99, sm=0.95, tensor=0.17, dram=0.57, fp32=0.05, fp16=0.02)
    base.update(mfu=0.16, mfu_reference=MfuReference(0.40, "llm-training"))
    base.update(kw)
    return ev(**base)


def test_founding_case_is_low_mfu_with_fusion_advice():
    verdict, findings = classify(founding_case(), Thresholds())
    assert verdict is Verdict.LOW_MFU
    f = findings[0]
    assert f.code == "low_mfu" and f.evidence["reason"] == "dram_busy"
    assert "FlashAttention" in f.message and "16.0 %" in f.message and "40.0 %" in f.message
    assert f.evidence["mfu_class"] == "llm-training"


def test_without_a_reference_the_founding_case_stays_healthy():
    verdict, findings = classify(founding_case(mfu_reference=None), Thresholds())
    assert verdict is Verdict.HEALTHY
    assert [f.code for f in findings] == ["healthy", "tensor_headroom"]


def test_near_the_reference_is_healthy_and_quiet_dram_says_tensor_low():
    assert classify(founding_case(mfu=0.30), Thresholds())[0] is Verdict.HEALTHY
    verdict, findings = classify(founding_case(dram=0.1, mfu=0.12), Thresholds())
    assert verdict is Verdict.LOW_MFU and findings[0].evidence["reason"] == "tensor_low"


def test_summary_carries_reference_class_and_recoverable_hours():
    from auditor.core.model import Bucket, GpuId, PodRef, Window
    from auditor.core.summary import summarize_job

    end = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
    pod, gpu = PodRef("ml", "train-0"), GpuId("GPU-1", index="0", model="NVIDIA H200")
    means = {
        Metric.GPU_UTIL: 0.99,
        Metric.SM_ACTIVE: 0.95,
        Metric.TENSOR_ACTIVE: 0.16,
        Metric.DRAM_ACTIVE: 0.57,
        Metric.FP32_ACTIVE: 0.05,
    }
    buckets = []
    for i in range(60):
        t = end - timedelta(minutes=60 - i)
        for m, v in means.items():
            buckets.append(Bucket(pod, gpu, m, t, t + timedelta(minutes=1), v * 4, 4, v, v))
    win = Window(end - timedelta(hours=1), end)
    j = labelled("llm-training", namespace="ml")
    ctx = reference_for(j, DEFAULT_CLASSES, None)
    s = summarize_job(j, buckets, window=win, now=end, interval=15.0, mfu=ctx)
    assert s.verdict is Verdict.LOW_MFU
    assert s.mfu_reference == 0.40 and s.mfu_class == "llm-training"
    # no clock series: tensor × the assumed clock share (1 − 0.3 × tensor) × the per-cycle rate
    assert s.mfu_estimate == pytest.approx(0.16 * (1 - 0.3 * 0.16) * 0.97, abs=1e-6)
    assert s.recoverable_gpu_hours == pytest.approx(s.gpu_hours * (1 - s.mfu_estimate / 0.40), rel=1e-4)
    doc = s.to_json()
    keys = list(doc)
    assert keys[keys.index("mfu_estimate") + 1 : keys.index("mfu_estimate") + 3] == ["mfu_reference", "mfu_class"]
    assert keys[keys.index("waste_gpu_hours") + 1] == "recoverable_gpu_hours"
    plain = summarize_job(j, buckets, window=win, now=end, interval=15.0)
    assert plain.verdict is Verdict.HEALTHY
    assert plain.mfu_reference is None and plain.mfu_class is None and plain.recoverable_gpu_hours is None
    assert MfuContext() == MfuContext(None, False)


def test_old_documents_without_the_mfu_fields_read_as_none():
    from auditor.core.job_summary import JobSummary

    doc = JobSummary.example(mfu_estimate=0.2).to_json()
    for k in ("mfu_reference", "mfu_class", "recoverable_gpu_hours"):
        del doc[k]
    s = JobSummary.from_json(doc)
    assert s.mfu_reference is None and s.mfu_class is None and s.recoverable_gpu_hours is None
    assert s.extra == {}


@pytest.mark.parametrize("mfu", [0.14, 0.20, 0.26, 0.30, 0.40, 0.47])
def test_a_healthy_jobs_recoverable_hours_are_bounded(mfu):
    """Healthy only at or above low_mfu_ratio of the reference: recoverable ≤ 1 − low_mfu_ratio (35 %)."""
    th = Thresholds()
    verdict, _ = classify(founding_case(mfu=mfu), th)
    share = recoverable_gpu_hours(1.0, mfu, 0.40)
    assert (verdict is Verdict.HEALTHY) == (share <= 1 - th.low_mfu_ratio + 1e-9)
    assert verdict in (Verdict.HEALTHY, Verdict.LOW_MFU)
