from datetime import timedelta

import pytest

from auditor.core.thresholds import ThresholdError, Thresholds, match_model
from auditor.errors import BadInput


@pytest.mark.parametrize(
    "model, floor, clock",
    [
        ("NVIDIA H200", 250.0, 1980.0),
        ("NVIDIA H100 80GB HBM3", 200.0, 1980.0),
        ("NVIDIA H100 PCIe", 200.0, 1755.0),  # longest key wins
        ("NVIDIA A100-SXM4-80GB", 150.0, 1410.0),
        ("Tesla T4", None, None),
    ],
)
def test_model_tables(model, floor, clock):
    th = Thresholds()
    assert th.power_floor(model) == floor
    assert th.max_clock(model) == clock


def test_from_mapping_overrides_and_merges():
    th = Thresholds.from_mapping({"low_sm": 0.4, "min_span": 600, "power_floor_w": {"T4": 40}})
    assert th.low_sm == 0.4 and th.min_span == timedelta(minutes=10)
    assert th.power_floor("Tesla T4") == 40 and th.power_floor("NVIDIA H200") == 250
    assert Thresholds.from_mapping(None) == Thresholds()


@pytest.mark.parametrize(
    "values, message",
    [
        ({"low_smm": 0.4}, "settings.thresholds.low_smm: unknown threshold (known: busy_util, "),
        (
            {"low_sm": 1.5},
            "settings.thresholds.low_sm: 1.5 is out of range (0–1 ratio); ratios are 0–1: did you mean 0.015?",
        ),
        (
            {"low_sm": 90},
            "settings.thresholds.low_sm: 90 is out of range (0–1 ratio); ratios are 0–1: did you mean 0.9?",
        ),
        ({"low_sm": -0.1}, "settings.thresholds.low_sm: -0.1 is out of range (0–1 ratio)"),
        ({"low_sm": "high"}, "settings.thresholds.low_sm: expected a number (0–1 ratio), got 'high'"),
        ({"low_sm": True}, "settings.thresholds.low_sm: expected a number (0–1 ratio), got True"),
        ({"low_sm": float("nan")}, "settings.thresholds.low_sm: nan is not a finite number"),
        ({"min_samples": 2.5}, "settings.thresholds.min_samples: 2.5 is not a whole number of samples"),
        (
            {"min_span": "soon"},
            "settings.thresholds.min_span: expected seconds or a duration such as 90s or 2m, got 'soon'",
        ),
        ({"min_span": -1}, "settings.thresholds.min_span: -1 is out of range (≥ 0 seconds)"),
        ({"power_floor_w": 3}, "settings.thresholds.power_floor_w: expected a mapping of GPU model → W, got 3"),
        ({"power_floor_w": {"T4": 9000}}, "settings.thresholds.power_floor_w.T4: 9000 is out of range (0–5000 W)"),
        (
            {"max_sm_clock_mhz": {"H200": 1.98e9}},
            "settings.thresholds.max_sm_clock_mhz.H200: 1.98e+09 is out of range (1–10000 MHz); clocks are in MHz: did you mean 1980?",
        ),
        (
            {"max_sm_clock_mhz": {"H200": 0}},
            "settings.thresholds.max_sm_clock_mhz.H200: 0 is out of range (1–10000 MHz)",
        ),
        # inconsistent pairs: the verdict bands they bound would be empty or inverted
        ({"idle_util": 0.7}, "settings.thresholds.idle_util: idle_util (0.7) must not exceed busy_util (0.6)"),
        ({"busy_util": 0.01}, "settings.thresholds.busy_util: idle_util (0.05) must not exceed busy_util (0.01)"),
        (
            {"tensor_headroom": 0.01},
            "settings.thresholds.tensor_headroom: tensor_idle (0.1) must not exceed tensor_headroom (0.01)",
        ),
    ],
)
def test_from_mapping_rejects_naming_the_key(values, message):
    with pytest.raises(BadInput) as err:
        Thresholds.from_mapping(values, where="settings.thresholds")
    assert str(err.value).startswith(message), str(err.value)


def test_from_mapping_takes_text_and_durations():
    """Environment variables arrive as text; ``min_span`` also takes the settings' duration format."""
    th = Thresholds.from_mapping({"low_sm": "0.4", "min_samples": "6", "min_span": "2m"})
    assert (th.low_sm, th.min_samples, th.min_span) == (0.4, 6, timedelta(minutes=2))
    assert Thresholds.from_mapping({"min_span": "0s"}).min_span == timedelta(0)
    # equal bounds are allowed: they switch the band between them off
    assert Thresholds.from_mapping({"idle_util": 0.6}).idle_util == 0.6


def test_model_table_entries_replace_across_case():
    """``GPU_AUDITOR_THRESHOLDS__POWER_FLOOR_W__H200`` arrives as ``h200``: it replaces ``H200``."""
    th = Thresholds.from_mapping({"power_floor_w": {"h200": 300}})
    assert th.power_floor("NVIDIA H200") == 300
    assert [k for k in th.power_floor_w if k.casefold() == "h200"] == ["h200"]


def test_as_dict_is_json_friendly():
    import json

    json.dumps(Thresholds().as_dict())
    assert match_model({}, "x") is None


def test_issue_28_thresholds_are_settable_and_checked():
    th = Thresholds.from_mapping(
        {"healthy_max_waste": "0.3", "stall_share": 0.2, "low_occupancy": 0.1, "pcie_offload_bytes": 5e8}
    )
    assert (th.healthy_max_waste, th.stall_share, th.low_occupancy, th.pcie_offload_bytes) == (0.3, 0.2, 0.1, 5e8)
    assert Thresholds.from_mapping({"low_mfu_ratio": 0.5, "mfu_tensor_rate": 1}).low_mfu_ratio == 0.5
    with pytest.raises(ThresholdError, match="math_pipe_idle .* must not exceed math_pipe_busy"):
        Thresholds.from_mapping({"math_pipe_busy": 0.01})
    with pytest.raises(ThresholdError, match="low_mfu_ratio"):
        Thresholds.from_mapping({"low_mfu_ratio": 65})
