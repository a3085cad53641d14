"""The NVML sampler's reads per device per tick: one GPM sample, one metrics request for all
metrics, and no re-read of what does not change (the agent's CPU per GPU per sample, issue 18).

NVML cannot run without an NVIDIA driver, so this is the one place with a stand-in: a module
with pynvml's names that counts the calls the sampler makes (the real library is measured on
the H200 by bench/agent_cpu_bench.py).
"""

from __future__ import annotations

import ctypes
import sys
import types
from collections import Counter
from typing import Any, Iterator

import pytest

from auditor.agent.fields import GPM_FIELDS


class _Metric(ctypes.Structure):
    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint), ("value", ctypes.c_double)]


class _MetricsGet(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", ctypes.c_void_p),
        ("sample2", ctypes.c_void_p),
        ("metrics", _Metric * 64),
    ]


def _fake_pynvml(calls: Counter[str], gpus: int) -> types.ModuleType:
    N = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def counted(name: str, result: Any = None) -> Any:
        def fn(*args: Any) -> Any:
            calls[name] += 1
            return result(*args) if callable(result) else result

        return fn

    samples = iter(range(1, 10_000))
    taken_at: dict[int, int] = {}  # sample buffer -> the GPM sample number written into it
    clock = iter(range(10_000))

    def sample_get(handle: str, buf: int) -> None:
        taken_at[buf] = next(clock)

    def metrics_get(mg: _MetricsGet) -> None:
        # each metric's value: the metric id plus the span between its two samples (in samples
        # of all GPUs), so a test sees which interval a value covers
        span = taken_at[mg.sample2] - taken_at[mg.sample1]
        for i in range(mg.numMetrics):
            mg.metrics[i].nvmlReturn = 0
            mg.metrics[i].value = mg.metrics[i].metricId + 100.0 * span

    util = types.SimpleNamespace(gpu=70, memory=30)
    mem = types.SimpleNamespace(used=2 * 1048576, free=6 * 1048576)
    N.NVMLError = NVMLError  # type: ignore[attr-defined]
    N.NVML_CLOCK_SM, N.NVML_CLOCK_MEM = 1, 2  # type: ignore[attr-defined]
    N.NVML_GPM_METRICS_GET_VERSION = 1  # type: ignore[attr-defined]
    N.c_nvmlGpmMetricsGet_t = _MetricsGet  # type: ignore[attr-defined]
    for name, result in {
        "nvmlInit": None,
        "nvmlShutdown": None,
        "nvmlSystemGetDriverVersion": "580.0",
        "nvmlDeviceGetCount": gpus,
        "nvmlDeviceGetHandleByIndex": lambda i: f"h{i}",
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}",
        "nvmlDeviceGetName": "NVIDIA H200",
        "nvmlDeviceGetPciInfo": types.SimpleNamespace(busId="00000000:01:00.0"),
        "nvmlDeviceGetMigMode": (0, 0),
        "nvmlGpmQueryDeviceSupport": types.SimpleNamespace(isSupportedDevice=1),
        "nvmlGpmSampleAlloc": lambda: next(samples),
        "nvmlGpmSampleFree": None,
        "nvmlGpmSampleGet": sample_get,
        "nvmlGpmMetricsGet": metrics_get,
        "nvmlDeviceGetUtilizationRates": util,
        "nvmlDeviceGetMemoryInfo": mem,
        "nvmlDeviceGetPowerUsage": 350_000,
        "nvmlDeviceGetClockInfo": lambda h, clock: 1980 if clock == 1 else 3201,
        "nvmlDeviceGetMaxClockInfo": 1980,
    }.items():
        setattr(N, name, counted(name, result))
    return N


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    calls: Counter[str] = Counter()
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(calls, gpus=8))
    yield calls


def test_a_tick_makes_one_gpm_sample_and_one_metrics_request_per_gpu(nvml: Counter[str]) -> None:
    from auditor.agent.nvml import SLOW_GPM, NvmlSampler

    sampler = NvmlSampler(gpm=True, gpm_every=1, slow_every=10)
    sampler.sample()  # the first tick has no earlier GPM sample to compare with
    nvml.clear()
    values = sampler.sample()
    per_gpu = {name: n / 8 for name, n in nvml.items() if name.startswith("nvmlDevice") or name.startswith("nvmlGpm")}
    assert per_gpu == {
        "nvmlGpmSampleGet": 1,
        "nvmlGpmMetricsGet": 1,
        "nvmlDeviceGetUtilizationRates": 1,
        "nvmlDeviceGetMemoryInfo": 1,
        "nvmlDeviceGetPowerUsage": 1,
        "nvmlDeviceGetClockInfo": 2,
    }
    gpu = values["GPU-h0"]
    assert gpu["DCGM_FI_DEV_MAX_SM_CLOCK"] == 1980.0  # read once at discovery, served every tick
    assert gpu["DCGM_FI_DEV_POWER_USAGE"] == 350.0
    for f in GPM_FIELDS:  # every other GPM metric from the one request, over one tick (8 GPUs)
        if f.name in SLOW_GPM:
            assert f.name not in gpu
        else:
            assert gpu[f.name] == pytest.approx(((f.gpm_id or 0) + 100.0 * 8) * f.gpm_scale)
    sampler.close()


def test_the_costly_gr_engine_metric_spans_its_own_longer_interval(nvml: Counter[str]) -> None:
    from auditor.agent.nvml import NvmlSampler

    sampler = NvmlSampler(gpm=True, gpm_every=2, slow_every=6)
    ticks = [sampler.sample()["GPU-h3"] for _ in range(13)]
    sampler.close()
    gr = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    with_gpm = [i for i, t in enumerate(ticks) if "DCGM_FI_PROF_SM_ACTIVE" in t]
    with_gr = [i for i, t in enumerate(ticks) if gr in t]
    assert with_gpm == [2, 4, 6, 8, 10, 12]  # tick 0 only starts the interval
    assert with_gr == [6, 12]
    assert all("DCGM_FI_DEV_GPU_UTIL" in t for t in ticks)  # the plain reads stay every tick
    # a GPM sample is taken on ticks 0, 2, 4, ... for all 8 GPUs: one tick apart = 8 samples
    assert ticks[6][gr] == pytest.approx((1 + 100.0 * 8 * 3) * 0.01)  # ticks 0 -> 6
    assert ticks[12][gr] == pytest.approx((1 + 100.0 * 8 * 3) * 0.01)  # ticks 6 -> 12
    assert ticks[4]["DCGM_FI_PROF_SM_ACTIVE"] == pytest.approx((2 + 100.0 * 8) * 0.01)  # ticks 2 -> 4
    assert nvml["nvmlGpmSampleAlloc"] == 8 * 3  # two metric groups: three buffers per GPU, no more
