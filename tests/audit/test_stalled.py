"""Issue 33, part 4: a hung distributed job gets its own finding, on the recorded hang.

``h200-hang`` holds one rank of a hung collective (one H200 was lent: blocks polling a flag that
never changes). A multi-GPU job is built as the demo builds its 4-GPU llm-finetune
(auditor/cli/demo.py): the phase replayed on every GPU of one pod. The expected verdicts were
committed before the rule existed (tests/hang_expected.py). The demo's DDP straggler — three ranks
spinning on 4 blocks waiting on one starved by its host, from ``h200-demo-cluster`` — keeps its
straggler headline: only a job whose ranks ALL spin is stalled.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from importlib import resources

import pytest
from hang_expected import EXPECTED, HUNG, STRAGGLER
from mfu_replay import END, HOUR, reason

from auditor.core.model import JobRef, PodRef, Window
from auditor.core.summary import summarize_job
from auditor.core.thresholds import ThresholdError, Thresholds
from auditor.sources.replay import ReplaySource
from auditor.traces import Trace, TraceJob, load_trace, make_gpus

WINDOW = Window(END - 3 * HOUR, END)


def _hang() -> Trace:
    return load_trace(str(resources.files("auditor").joinpath("data", "h200-hang.csv")))


def _audit(trace: Trace, jobs: list[TraceJob], th: Thresholds | None = None) -> dict[str, dict]:
    """Each TraceJob's pod as one PyTorchJob, replayed for an hour at 5 s, summarized."""
    src = ReplaySource([(trace, jobs)], end=END, duration=HOUR, interval=timedelta(seconds=5))
    by_pod = defaultdict(list)
    for b in src.read(WINDOW, timedelta(minutes=5)).buckets:
        by_pod[b.pod].append(b)
    out = {}
    for j in jobs:
        job = JobRef("c", "bench", "PyTorchJob", j.pod.pod, team="bench")
        out[j.pod.pod] = summarize_job(
            job, by_pod[j.pod], window=WINDOW, now=END, interval=5.0, thresholds=th
        ).to_json()
    return out


def _job(phase: str, gpus: int, **kw) -> TraceJob:
    name = f"{phase.replace('_', '-')}-{gpus}"
    return TraceJob(PodRef("bench", name), make_gpus(gpus, f"node-{name}"), phase, **kw)


@pytest.fixture(scope="module")
def recorded() -> dict[tuple[str, int], dict]:
    jobs = {key: _job(*key) for key in EXPECTED}
    got = _audit(_hang(), list(jobs.values()))
    return {key: got[j.pod.pod] for key, j in jobs.items()}


@pytest.mark.parametrize("key", list(EXPECTED), ids=[f"{p}-{n}gpu" for p, n in EXPECTED])
def test_recorded_phases_get_the_expected_verdict(recorded, key):
    s = recorded[key]
    assert (s["verdict"], reason(s)) == EXPECTED[key]


@pytest.mark.parametrize("phase", HUNG)
def test_stalled_finding_names_every_rank_and_the_fix(recorded, phase):
    s = recorded[(phase, 8)]
    first = s["findings"][0]
    assert first["code"] == "low_sm_efficiency" and first["message"].startswith("Stalled: all 8 GPUs")
    for words in ("a rank died or deadlocked", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_DEBUG=INFO", "checkpoint"):
        assert words in first["message"]
    assert "launch more thread blocks" not in first["message"]
    ev = first["evidence"]
    assert len(ev["gpus"]) == 8 and all(g["busy"] >= 0.99 for g in ev["gpus"])
    assert ev["power_w"] < ev["power_floor_w"] == 250.0  # 122-123 W recorded, the idle H200's 121 W
    assert ev["tensor_active"] == ev["dram_active"] == 0.0
    # the per-GPU verdicts stay what one spinning GPU is
    assert {g["verdict"] for g in s["per_gpu"]} == {"low_sm_efficiency"}


def test_the_ddp_straggler_keeps_its_straggler_headline():
    """The demo's llm-finetune (auditor/cli/demo.py): ranks 0-2 spin on 4 blocks (no pipe, no DRAM,
    124 W: each alone is in the hang signature), rank 3 is starved by its host."""
    spin = "kernel_spin_waiting_4_blocks"
    job = TraceJob(
        PodRef("bench", "llm-finetune-worker-0"),
        make_gpus(4, "node-finetune"),
        spin,
        gpu_phases=(spin,) * 3 + ("cpu_bound_preprocessing",),
    )
    s = _audit(load_trace("h200-demo-cluster"), [job])["llm-finetune-worker-0"]
    assert (s["verdict"], reason(s)) == STRAGGLER
    # and the same three spinning ranks without the slow one are a hang
    hung = TraceJob(PodRef("bench", "spin-3"), make_gpus(3, "node-spin"), spin)
    s = _audit(load_trace("h200-demo-cluster"), [hung])["spin-3"]
    assert (s["verdict"], reason(s)) == ("low_sm_efficiency", "stalled")


def test_one_working_rank_is_not_a_hang():
    """A job with one rank at work (the bf16 matmul) and one spinning is not stalled."""
    job = TraceJob(
        PodRef("bench", "mixed"),
        make_gpus(2, "node-mixed"),
        "hung_spin_2sm",
        ("hung_spin_2sm", "bf16_matmul_full_power"),
    )
    s = _audit(_hang(), [job])["mixed"]
    assert reason(s) != "stalled"


def test_a_spin_shorter_than_stall_min_span_is_few_blocks():
    """Observed 4 minutes: judged (min_span 1 min) but not yet a hang (stall_min_span 5 min)."""
    jobs = [_job("hung_spin_8sm", 2, duration=timedelta(minutes=4))]
    s = _audit(_hang(), jobs)[jobs[0].pod.pod]
    assert (s["verdict"], reason(s)) == ("low_sm_efficiency", "few_blocks")
    s = _audit(_hang(), jobs, Thresholds.from_mapping({"stall_min_span": "3m"}))[jobs[0].pod.pod]
    assert reason(s) == "stalled"


def test_a_hang_drawing_work_power_is_not_stalled():
    """Where power says the GPU works (above the model's power floor), the counters are not trusted
    to say it hangs: with a floor below the recorded 122 W the job is few_blocks again."""
    jobs = [_job("hung_spin_2sm", 2)]
    s = _audit(_hang(), jobs, Thresholds.from_mapping({"power_floor_w": {"H200": 100}}))[jobs[0].pod.pod]
    assert reason(s) == "few_blocks"


def test_stall_thresholds_are_settable_and_checked():
    th = Thresholds.from_mapping({"stall_min_span": "10m", "stall_pipe_idle": "0.02", "stall_dram_idle": 0.005})
    assert th.stall_min_span == timedelta(minutes=10) and th.stall_pipe_idle == 0.02 and th.stall_dram_idle == 0.005
    assert th.as_dict()["stall_min_span"] == 600.0
    with pytest.raises(ThresholdError, match="stall_min_span"):
        Thresholds.from_mapping({"stall_min_span": "soon"})
    with pytest.raises(ThresholdError, match="stall_pipe_idle"):
        Thresholds.from_mapping({"stall_pipe_idle": 2})


# --------------------------------------------------------------------------- the hung-job policy


def _hung_job_policy():
    from pathlib import Path

    from auditor.policy.loader import parse_policies

    path = Path(__file__).resolve().parents[2] / "policies" / "hung-job" / "policy.yaml"
    (policy,) = parse_policies(path.read_text(), str(path))
    return policy


def _policy_fires(trace: Trace, jobs: list[TraceJob], pod: str) -> tuple[bool, str, dict]:
    """The shipped hung-job policy on ``pod``'s summary and its stored 5-minute buckets."""
    from auditor.core.job_summary import JobSummary
    from auditor.policy.evaluate import evaluate

    src = ReplaySource([(trace, jobs)], end=END, duration=HOUR, interval=timedelta(seconds=5))
    buckets = [b for b in src.read(WINDOW, timedelta(minutes=5)).buckets if b.pod.pod == pod]
    job = JobRef("c", "bench", "PyTorchJob", pod, team="bench")
    summary = summarize_job(job, buckets, window=WINDOW, now=END, interval=5.0)
    ev = evaluate(_hung_job_policy(), JobSummary.from_json(summary.to_json(), "test"), now=END, buckets=buckets)
    return ev.fires, ev.reason, summary.to_json()


@pytest.mark.parametrize("gpus, fires", [(2, True), (8, True), (1, False)])
def test_hung_job_policy_on_the_recording(gpus, fires):
    job = _job("hung_spin_2sm", gpus)
    got, why, _ = _policy_fires(_hang(), [job], job.pod.pod)
    assert got is fires, why


def test_hung_job_policy_leaves_the_straggler_alone():
    spin = "kernel_spin_waiting_4_blocks"
    job = TraceJob(
        PodRef("bench", "ft"), make_gpus(4, "node-ft"), spin, gpu_phases=(spin,) * 3 + ("cpu_bound_preprocessing",)
    )
    got, why, _ = _policy_fires(load_trace("h200-demo-cluster"), [job], "ft")
    assert not got, why


def test_hung_job_policy_catches_a_hang_after_hours_of_work():
    """Trained 45 minutes (the bf16 matmul at the power cap), then hung for 15: the job's means are
    still the training's (healthy), the trailing buckets are the hang's: the policy fires."""
    pod, gpus = PodRef("bench", "late-hang"), make_gpus(2, "node-late")
    jobs = [
        TraceJob(pod, gpus, "bf16_matmul_full_power", duration=timedelta(minutes=45), end_offset=timedelta(minutes=15)),
        TraceJob(pod, gpus, "hung_spin_8sm", duration=timedelta(minutes=15)),
    ]
    got, why, summary = _policy_fires(_hang(), jobs, "late-hang")
    assert summary["verdict"] == "healthy" and reason(summary) != "stalled"
    assert got, why
