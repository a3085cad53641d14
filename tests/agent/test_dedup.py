"""One source per GPU and metric when the agent and dcgm-exporter export the same GPU."""

from __future__ import annotations

from auditor.core.source_preference import device_of, prefer_one_source, promql_prefer_agent, source_of

AGENT = {"source": "gpu-auditor-agent"}


def S(name: str, uuid: str, **labels: str) -> dict:
    return {"__name__": name, "UUID": uuid, **labels}


def test_agent_wins_per_gpu_and_metric_exporter_fills_what_the_agent_lacks():
    items = [
        S("DCGM_FI_DEV_GPU_UTIL", "GPU-1", pod="p"),  # exporter
        S("DCGM_FI_DEV_GPU_UTIL", "GPU-1", pod="p", **AGENT),  # agent: wins
        S("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "GPU-1", pod="p"),  # exporter only: kept
        S("DCGM_FI_PROF_SM_ACTIVE", "GPU-1", pod="p", **AGENT),  # agent only: kept
        S("DCGM_FI_DEV_GPU_UTIL", "GPU-2", pod="q"),  # another GPU, exporter only
        S("DCGM_FI_DEV_GPU_UTIL", "GPU-3", GPU_I_ID="1"),  # MIG instances are separate devices
        S("DCGM_FI_DEV_GPU_UTIL", "GPU-3", GPU_I_ID="2", **AGENT),
        {"__name__": "DCGM_FI_DEV_GPU_UTIL"},  # no device: kept for the caller to report
    ]
    kept, dropped = prefer_one_source(items, labels=lambda x: x)
    assert dropped == [items[0]]
    assert kept == items[1:]


def test_metric_key_lets_old_and_new_names_compete():
    items = [S("DCGM_FI_PROF_SM_UTIL_RATIO", "GPU-1"), S("DCGM_FI_PROF_SM_ACTIVE", "GPU-1", **AGENT)]
    kept, dropped = prefer_one_source(items, labels=lambda x: x, metric=lambda x: "sm_active")
    assert kept == [items[1]] and dropped == [items[0]]


def test_uuid_spellings_and_custom_order():
    assert device_of({"uuid": "GPU-1"}) == device_of({"UUID": "GPU-1"}) == "GPU-1"
    assert device_of({"Hostname": "n", "gpu": "0"}) == "n:0"
    assert device_of({"gpu": "0"}) is None
    assert source_of({}) == "dcgm-exporter" and source_of(AGENT) == "gpu-auditor-agent"
    items = [S("X", "GPU-1"), S("X", "GPU-1", **AGENT)]
    kept, _ = prefer_one_source(items, labels=lambda x: x, order=("dcgm-exporter", "gpu-auditor-agent"))
    assert kept == [items[0]]


def test_promql_form():
    q = promql_prefer_agent('X{source="gpu-auditor-agent"}', 'X{source!="gpu-auditor-agent"}', "sum", 299999)
    assert q == (
        'sum_over_time(X{source="gpu-auditor-agent"}[299999ms]) or on(UUID, GPU_I_ID) '
        'sum_over_time(X{source!="gpu-auditor-agent"}[299999ms])'
    )
