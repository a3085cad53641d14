"""The agent's GPU health series (issue 33, part 3): what NVML calls give them, at what pace, and how
a scrape combines them (bits seen, the last code, never a mean).

NVML needs a driver: the stand-in is test_nvml_reads' module with pynvml's names, given the health
calls here (the real library served these fields on the H200: tests/fixtures and docs/agent.md).
"""

from __future__ import annotations

import sys
import types
from collections import Counter
from typing import Any, Iterator

import pytest
from test_nvml_reads import _fake_pynvml

from auditor.agent.window import SampleWindow, Tick

XID_EVENT = 0x0000000000000008  # nvmlEventTypeXidCriticalError (pynvml)


class _Health:
    """What the fake GPUs report: per GPU index a bitmask, ECC and row-remap counters, queued Xids."""

    def __init__(self) -> None:
        self.mask = {0: 0x4, 1: 0x4 | 0x40}
        self.dbe = 0
        self.rows = (0, 0, 0, 0)
        self.queue: list[tuple[int, int]] = []  # (GPU index, Xid)
        self.ecc_supported = True


def _with_health(N: types.ModuleType, calls: Counter[str], health: _Health) -> None:
    def counted(name: str, fn: Any) -> Any:
        def wrapped(*args: Any) -> Any:
            calls[name] += 1
            return fn(*args)

        return wrapped

    def ecc(h: str, error_type: int, counter: int) -> int:
        if not health.ecc_supported:
            raise N.NVMLError("Not Supported")
        return health.dbe if error_type == 1 else 7

    def wait(event_set: object, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # never blocks the sampling tick
        if not health.queue:
            raise N.NVMLError("Timeout")
        index, xid = health.queue.pop(0)
        return types.SimpleNamespace(device=f"h{index}", eventType=XID_EVENT, eventData=xid)

    N.NVML_VOLATILE_ECC, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, 1, 0  # type: ignore[attr-defined]
    N.nvmlEventTypeXidCriticalError = XID_EVENT  # type: ignore[attr-defined]
    for name, fn in {
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: health.mask[int(h[1:])],
        "nvmlDeviceGetTotalEccErrors": ecc,
        "nvmlDeviceGetRemappedRows": lambda h: health.rows,
        "nvmlEventSetCreate": lambda: "events",
        "nvmlEventSetFree": lambda s: None,
        "nvmlDeviceRegisterEvents": lambda h, types_, s: None,
        "nvmlEventSetWait_v2": wait,
        "nvmlDeviceGetIndex": lambda h: int(h[1:]),
    }.items():
        setattr(N, name, counted(name, fn))


@pytest.fixture
def health(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[_Health, Counter[str]]]:
    calls: Counter[str] = Counter()
    N = _fake_pynvml(calls, gpus=2)
    h = _Health()
    _with_health(N, calls, h)
    monkeypatch.setitem(sys.modules, "pynvml", N)
    yield h, calls


def test_health_series_and_their_pace(health: tuple[_Health, Counter[str]]) -> None:
    from auditor.agent.nvml import NvmlSampler

    h, calls = health
    sampler = NvmlSampler(gpm=False, slow_every=5)
    ticks = [sampler.sample() for _ in range(10)]
    g0, g1 = ticks[0]["GPU-h0"], ticks[0]["GPU-h1"]
    assert g0["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0x4 and g1["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0x44
    assert g0["DCGM_FI_DEV_XID_ERRORS"] == 0  # registered, none seen yet
    assert g0["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 0 and g0["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == 7
    assert g0["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] == 0 and g0["DCGM_FI_DEV_ROW_REMAP_FAILURE"] == 0
    # the bitmask every tick; the counters every slow_every ticks; one event wait per tick for all GPUs
    assert [("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in t["GPU-h0"]) for t in ticks] == [True] + [False] * 4 + [True] + [
        False
    ] * 4
    assert calls["nvmlDeviceGetCurrentClocksEventReasons"] == 20
    assert calls["nvmlDeviceGetTotalEccErrors"] == 2 * 2 * 2
    assert calls["nvmlDeviceGetRemappedRows"] == 2 * 2
    assert calls["nvmlEventSetWait_v2"] == 10
    sampler.close()


def test_xid_events_become_the_last_code_of_their_gpu(health: tuple[_Health, Counter[str]]) -> None:
    from auditor.agent.nvml import NvmlSampler

    h, _ = health
    sampler = NvmlSampler(gpm=False)
    sampler.sample()
    h.queue = [(1, 48), (1, 94)]
    t = sampler.sample()
    assert t["GPU-h1"]["DCGM_FI_DEV_XID_ERRORS"] == 94 and t["GPU-h0"]["DCGM_FI_DEV_XID_ERRORS"] == 0
    assert sampler.sample()["GPU-h1"]["DCGM_FI_DEV_XID_ERRORS"] == 94  # held until the next one
    sampler.close()


def test_an_unsupported_read_is_dropped_not_zero(health: tuple[_Health, Counter[str]]) -> None:
    from auditor.agent.nvml import NvmlSampler

    h, calls = health
    h.ecc_supported = False
    sampler = NvmlSampler(gpm=False, slow_every=1)
    ticks = [sampler.sample() for _ in range(3)]
    assert all("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" not in t["GPU-h0"] for t in ticks)
    assert calls["nvmlDeviceGetTotalEccErrors"] == 2  # asked once per GPU, never again
    assert all("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS" in t["GPU-h0"] for t in ticks)
    sampler.close()


def test_without_the_health_calls_the_agent_serves_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older pynvml (or a stand-in) without them: no health series, no errors."""
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(Counter(), gpus=1))
    from auditor.agent.nvml import NvmlSampler

    sampler = NvmlSampler(gpm=False)
    values = sampler.sample()["GPU-h0"]
    assert not {k for k in values if "XID" in k or "EVENT" in k or "ECC" in k or "REMAP" in k}
    assert sampler.errors == 0
    sampler.close()


def test_a_scrape_serves_bits_seen_and_the_last_code_never_a_mean() -> None:
    w = SampleWindow(first_window=100)
    for t, mask, xid, util in ((1.0, 0x4, 0, 100.0), (2.0, 0x4 | 0x8, 79, 50.0), (3.0, 0x4, 79, 0.0)):
        fields = {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": mask, "DCGM_FI_DEV_XID_ERRORS": xid, "DCGM_FI_DEV_GPU_UTIL": util}
        w.add(Tick(t, {"G": (None, fields)}))
    means, n = w.take("prom", 3.5)
    got = {k: m.value for k, m in means[("G", None)].items()}
    assert n == 3
    assert got == {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0xC, "DCGM_FI_DEV_XID_ERRORS": 79, "DCGM_FI_DEV_GPU_UTIL": 50.0}
