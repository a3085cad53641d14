from datetime import timedelta

import pytest

from auditor.core.thresholds import Thresholds, match_model
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
    "values, needle",
    [
        ({"low_smm": 0.4}, "unknown threshold 'low_smm'"),
        ({"low_sm": 1.5}, "out of range"),
        ({"low_sm": "high"}, "expected a number"),
        ({"power_floor_w": 3}, "mapping"),
    ],
)
def test_from_mapping_rejects(values, needle):
    with pytest.raises(BadInput, match=needle):
        Thresholds.from_mapping(values, where="settings.thresholds")


def test_as_dict_is_json_friendly():
    import json

    json.dumps(Thresholds().as_dict())
    assert match_model({}, "x") is None
