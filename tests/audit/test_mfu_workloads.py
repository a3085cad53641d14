"""Issue 28 on real H200 recordings: verdicts, advice, MFU and recoverable GPU-hours with the
jobs' workload classes.

The old recording (``h200-workloads``, issue 15) is what the rules were tuned on: labelled with
its classes, every workload keeps its verdict except the founding case — the materialised-attention
transformer at s 1024, ``healthy`` before — which is ``low_mfu`` now; and on both fused/unfused
pairs the unfused job's recoverable GPU-hours match what its fused twin saves.

The new recording (``h200-mfu-workloads``) is the held-out check: recorded after the rules were
committed (bf80750), its expected verdicts written before it ran. It was run once, as is; the
three workloads whose verdict differs from the written expectation are marked below with why,
not retuned away.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest
from mfu_replay import reason, replay
from mfu_workloads_expected import EXPECTED, PAIRS
from workload_verdicts import REASONS, WORKLOADS


def _truth(name: str) -> dict:
    return json.loads(resources.files("auditor").joinpath("data", f"{name}.truth.json").read_text())


def _old_class(phase: str) -> tuple[str | None, str]:
    """The class each old workload would carry in a cluster (the old truth has none)."""
    if phase.startswith(("transformer_", "dataloader_stall")):
        return "llm-training", "PyTorchJob"
    if phase.startswith("resnet50"):
        return "cnn-training", "PyTorchJob"
    if phase.startswith("llm_decode"):
        return "llm-inference", "Deployment"
    return None, "Job"


#: what the classes change on the old recording, and why
CHANGED = {
    # the founding case: tensor 16 %, DRAM 60 %, MFU 0.158 against llm-training's 0.40
    "transformer_materialized_bf16_s1024": ("low_mfu", "dram_busy"),
    # decoding servers (a serving class): the idle time is a serving question, not CUDA Graphs
    "llm_decode_bf16_batch1": ("underutilized", "serving"),
    "llm_decode_bf16_batch64": ("underutilized", "serving"),
}


@pytest.fixture(scope="module")
def old() -> dict[str, dict]:
    return replay("h200-workloads", {p: _old_class(p) for p in WORKLOADS})


def test_old_recording_keeps_its_verdicts_but_the_founding_case(old):
    want = {p: CHANGED.get(p, (v, REASONS.get(p))) for p, v in WORKLOADS.items()}
    got = {p: (s["verdict"], reason(s) if p in REASONS or p in CHANGED else want[p][1]) for p, s in old.items()}
    assert got == want


def test_founding_case_is_low_mfu_with_fusion_advice_and_its_gap(old):
    s = old["transformer_materialized_bf16_s1024"]
    first = s["findings"][0]
    assert first["code"] == "low_mfu" and "FlashAttention" in first["message"]
    assert s["mfu_class"] == "llm-training" and s["mfu_reference"] == 0.4
    assert s["recoverable_gpu_hours"] == pytest.approx(s["gpu_hours"] * (1 - s["mfu_estimate"] / 0.4))


@pytest.mark.parametrize(
    "unfused, fused",
    [
        ("transformer_materialized_bf16_s1024", "transformer_sdpa_bf16_s1024"),
        ("transformer_materialized_bf16_s4096", "transformer_sdpa_bf16_s4096"),
    ],
)
def test_recoverable_hours_match_what_the_fused_twin_saves(old, unfused, fused):
    truth = _truth("h200-workloads")["workloads"]

    def steps_per_s(p: str) -> float:
        return truth[p]["steps"] / truth[p]["wall_s"]

    s = old[unfused]
    assert s["verdict"] in ("low_mfu", "memory_bound")  # flagged (s 4096: tensor 7.8 %, memory_bound)
    saved = s["gpu_hours"] * (1 - steps_per_s(unfused) / steps_per_s(fused))
    # measured on this recording: s 1024 +3 %, s 4096 +1 % (the issue asks within 25 %)
    assert s["recoverable_gpu_hours"] == pytest.approx(saved, rel=0.05)
    assert old[fused]["verdict"] == "healthy" and old[fused]["recoverable_gpu_hours"] == 0.0


def test_classes_without_a_reference_are_never_charged(old):
    for phase, s in old.items():
        klass, _ = _old_class(phase)
        if klass in (None, "cnn-training", "llm-inference"):
            assert s["mfu_reference"] is None and s["recoverable_gpu_hours"] is None, phase
            assert s["verdict"] != "low_mfu"


def test_mfu_estimate_within_two_points_on_bf16_and_fp8(old):
    truth = _truth("h200-workloads")["workloads"]
    errors = {p: old[p]["mfu_estimate"] - w["mfu"] for p, w in truth.items() if w.get("precision") in ("bf16", "fp8")}
    assert len(errors) >= 19
    assert max(abs(e) for e in errors.values()) <= 0.02, errors


def test_mfu_estimate_without_clocks_assumes_the_power_capped_clock():
    """Replayed without SM-clock series the estimate assumes the clock from the tensor load
    (Thresholds.mfu_clock_drop): bf16/FP8 within ±0.035 of measured (the max clock read the bf16
    product 0.23 high)."""
    from test_trace_verdicts import ALL, audit

    from auditor.core.metrics import Metric

    got = audit("h200-workloads", ALL - {Metric.SM_CLOCK, Metric.MAX_SM_CLOCK}, interval_s=5)
    truth = _truth("h200-workloads")["workloads"]
    errors = {p: got[p]["mfu_estimate"] - w["mfu"] for p, w in truth.items() if w.get("precision") in ("bf16", "fp8")}
    assert max(abs(e) for e in errors.values()) <= 0.035, errors


# --------------------------------------------------------------------------- the new recording
# ``h200-mfu-workloads`` (issue 28): recorded after the rules above were set on the old one, its
# expected verdicts written before it ran (tests/mfu_workloads_expected.py). The held-out check.

NEW = "h200-mfu-workloads"


#: where the held-out run differs from the expectation written before the recording, and why
MISSES = {
    # flagged, with FlashAttention advice, and its recoverable hours within 4 % of the truth; but its
    # tensor pipes are 9.3 % busy, below tensor_idle (0.1): memory_bound comes before low_mfu, as
    # for the old recording's s 4096 twin (7.8 %); the expectation guessed 0.10-0.15
    "gpt_unfused_d1024_s3072": ("memory_bound", "no_math_pipe"),
    # utilization 1.1 %: below the idle line (5 %), whatever the kind; the idle advice is scale to zero
    "llm_server_poisson_0p25rps": ("idle", None),
    # tensor 8.5 %, DRAM 35 %, measured MFU 0.075 (the expectation guessed 0.2-0.3): single-digit
    # tensor activity is never healthy (issue 15's rule); cnn-training has no reference, so it is
    # not low_mfu and nothing is charged
    "convnext_tiny_bf16_autocast": ("memory_bound", "dram_busy"),
}


@pytest.fixture(scope="module")
def new() -> dict[str, dict]:
    truth = _truth(NEW)["workloads"]
    recorded = {p: w for p, w in truth.items() if "error" not in w}  # the evaluation stall failed to record
    return replay(NEW, {p: (w.get("workload_class"), w.get("kind", "Job")) for p, w in recorded.items()})


@pytest.mark.parametrize(
    "phase", sorted(p for p in EXPECTED if "error" not in _truth(NEW)["workloads"].get(p, {"error": 1}))
)
def test_new_recording_gets_its_expected_verdict_and_advice(new, phase):
    want = EXPECTED[phase]
    s = new[phase]
    got = (s["verdict"], reason(s))
    if phase in MISSES:
        assert got == MISSES[phase] != (want.verdict, want.reason)
        pytest.xfail(f"held-out miss: {got}, expected {(want.verdict, want.reason)} (MISSES says why)")
    assert got == (want.verdict, want.reason), s["findings"][0]["message"]


@pytest.mark.parametrize("tag", sorted(PAIRS))
def test_new_pairs_unfused_flagged_and_recoverable_within_25_percent(new, tag):
    unfused, fused = PAIRS[tag]
    saved = new[unfused]["gpu_hours"] * _truth(NEW)["pairs"][tag]["saved_fraction"]
    assert new[unfused]["verdict"] in ("low_mfu", "memory_bound")
    assert new[unfused]["recoverable_gpu_hours"] == pytest.approx(saved, rel=0.25)


def _executed(w: dict) -> float:
    """A causal decoder's MFU with the attention FLOPs its flash kernel executes: the truth counts
    QKᵀ and AV whole (PaLM's convention), the kernel skips the masked half."""
    s, d, n, v = w["seq"], w["d_model"], w["layers"], w["vocab"]
    per_token = n * (24 * d * d + 4 * s * d) + 2 * d * v
    return w["mfu"] * (1 - n * 2 * s * d / per_token)


def test_new_mfu_estimate_on_bf16(new):
    """Within ±0.03 of measured on every bf16 job but the fused causal decoders, which the estimate
    reads low against the PaLM convention (their flash attention skips the masked half of the
    FLOPs the truth counts): within ±0.01 of the FLOPs they execute."""
    truth = _truth(NEW)["workloads"]
    errors = {p: new[p]["mfu_estimate"] - w["mfu"] for p, w in truth.items() if w.get("precision") == "bf16"}
    fused = {p for p in errors if p.startswith("gpt_fused")}
    assert len(errors) >= 13
    assert max(abs(e) for p, e in errors.items() if p not in fused) <= 0.03, errors
    assert max(abs(e) for p, e in errors.items() if p in fused) <= 0.05, errors
    assert all(abs(new[p]["mfu_estimate"] - _executed(truth[p])) <= 0.01 for p in fused)
