"""gpu_health (issue 33, part 3): synthetic Xid, ECC, row-remap and throttle series, and the recorded
H200 power-cap phase, which must not read as sick."""

from __future__ import annotations

import csv
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from auditor.core.gpu_health import (
    SLOWED_BY_GPU,
    ClockEvent,
    HealthSample,
    HealthThresholds,
    evaluate_gpu,
    job_health,
    samples_from_series,
)

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
DATA = Path(__file__).resolve().parents[2] / "auditor" / "data"


def series(n: int = 60, **fields: object) -> list[HealthSample]:
    """``n`` samples a second apart; a field given as a callable gets the sample index."""
    out = []
    for i in range(n):
        kw = {k: (v(i) if callable(v) else v) for k, v in fields.items()}
        out.append(HealthSample(T0 + timedelta(seconds=i), **kw))  # type: ignore[arg-type]
    return out


def recorded(phase: str) -> list[HealthSample]:
    """The h200-hang side sampler's rows of one phase (NVML clock-event reasons once a second)."""
    with (DATA / "h200-hang.nvml.csv").open() as fh:
        return [
            HealthSample(
                datetime.fromtimestamp(float(r["t"]), timezone.utc),
                clock_events=int(r["clocks_event_reasons"]),
                xid=0,
                ecc_dbe=0.0,
                remap_uncorrectable=0.0,
                remap_failed=0.0,
            )
            for r in csv.DictReader(fh)
            if r["phase"] == phase
        ]


def test_recorded_power_cap_phase_is_healthy() -> None:
    """The bf16 matmul at 682 of 700 W: 0x4 (SwPowerCap) every second, and no sickness."""
    samples = recorded("bf16_matmul_full_power")
    assert len(samples) >= 20
    assert all(s.clock_events == ClockEvent.SW_POWER_CAP for s in samples)
    h = evaluate_gpu("node-a gpu 0", samples)
    assert h.healthy and h.finding() is None
    assert h.evidence["sw_power_cap_share"] == 1.0
    assert job_health({"node-a gpu 0": samples}) == []


@pytest.mark.parametrize("phase", ["idle_memory_held", "hung_spin_2sm", "hung_spin_32sm"])
def test_recorded_other_phases_are_healthy(phase: str) -> None:
    h = evaluate_gpu("g", recorded(phase))
    assert h.healthy
    assert h.evidence["sw_power_cap_share"] == 0.0


@pytest.mark.parametrize("code,what", [(79, "fallen off the bus"), (48, "double-bit ECC"), (94, "contained ECC")])
def test_hardware_xid_in_the_window_exonerates(code: int, what: str) -> None:
    samples = series(xid=lambda i: code if i >= 30 else 0)
    h = evaluate_gpu("node-a gpu 3", samples)
    assert h.reasons == ("xid",)
    f = h.finding()
    assert f is not None and f.code == "gpu_health"
    assert f.evidence["reason"] == "xid" and f.evidence["slowed_by_gpu"] is True
    xid = f.evidence["xid"]
    assert isinstance(xid, dict)
    assert xid["codes"] == [code] and xid["hardware"] == [code]
    assert xid["first_seen"] == {str(code): "2026-12-03T12:00:30Z"}
    assert xid["held_from_before_window"] is False
    assert what in f.message and SLOWED_BY_GPU in f.message and "node-a gpu 3" in f.message


def test_xid_held_from_before_the_window_still_counts_and_says_so() -> None:
    h = evaluate_gpu("g", series(xid=79))
    assert h.reasons == ("xid",)
    assert h.evidence["xid"]["held_from_before_window"] is True  # type: ignore[index]


def test_application_xid_does_not_exonerate() -> None:
    """Xid 13 / 31 / 43 are what a program's own bug raises: kept as evidence, not sickness."""
    h = evaluate_gpu("g", series(xid=lambda i: 31 if i > 10 else (13 if i > 5 else 0)))
    assert h.healthy
    assert h.evidence["xid"] == {
        "codes": [13, 31],
        "hardware": [],
        "application": [13, 31],
        "unclassified": [],
        "first_seen": {"13": "2026-12-03T12:00:06Z", "31": "2026-12-03T12:00:11Z"},
        "held_from_before_window": False,
    }


def test_new_double_bit_ecc_errors_are_sick_old_ones_are_context() -> None:
    rising = evaluate_gpu("g", series(ecc_dbe=lambda i: 2.0 if i >= 40 else 0.0))
    assert rising.reasons == ("ecc",)
    assert rising.evidence["ecc_dbe"] == {"first": 0.0, "last": 2.0, "new": 2.0}
    flat = evaluate_gpu("g", series(ecc_dbe=3.0))
    assert flat.healthy and flat.evidence["ecc_dbe"] == {"first": 3.0, "last": 3.0, "new": 0.0}


def test_a_driver_reload_resets_the_volatile_total_without_a_false_rise() -> None:
    h = evaluate_gpu("g", series(ecc_dbe=lambda i: 5.0 if i < 30 else 0.0))
    assert h.healthy


def test_row_remap_rise_and_failure() -> None:
    rise = evaluate_gpu("g", series(remap_uncorrectable=lambda i: 1.0 if i > 50 else 0.0, remap_failed=0.0))
    assert rise.reasons == ("row_remap",)
    failed = evaluate_gpu("g", series(remap_uncorrectable=4.0, remap_failed=1.0))
    assert failed.reasons == ("row_remap",)
    f = failed.finding()
    assert f is not None and "row remapping failed" in f.message


@pytest.mark.parametrize(
    "bit,reason",
    [
        (ClockEvent.HW_SLOWDOWN, "hw_slowdown"),
        (ClockEvent.HW_POWER_BRAKE, "hw_slowdown"),
        (ClockEvent.SW_THERMAL, "thermal"),
        (ClockEvent.HW_THERMAL, "thermal"),
    ],
)
def test_hardware_protection_bits_over_time(bit: ClockEvent, reason: str) -> None:
    """A tenth of the window under the bit (alongside the usual power cap) is sickness."""
    mask = lambda i: int(ClockEvent.SW_POWER_CAP | bit) if i % 10 == 0 else int(ClockEvent.SW_POWER_CAP)  # noqa: E731
    h = evaluate_gpu("g", series(clock_events=mask))
    assert h.reasons == (reason,)
    ce = h.evidence["clock_events"]
    assert isinstance(ce, dict)
    assert ce[f"{reason}_share"] == 0.1 and ce["share"]["sw_power_cap"] == 1.0


def test_one_slowdown_blip_is_not_sickness() -> None:
    """DCGM: HW slowdown 'may be also reported during PState or clock change'."""
    h = evaluate_gpu("g", series(n=10, clock_events=lambda i: 0x8 if i == 3 else 0x4))
    assert h.healthy
    th = HealthThresholds(min_slowdown_samples=1)
    assert evaluate_gpu("g", series(n=10, clock_events=lambda i: 0x8 if i == 3 else 0x4), th).reasons == (
        "hw_slowdown",
    )


def test_idle_and_sync_boost_and_settings_bits_are_not_sickness() -> None:
    h = evaluate_gpu(
        "g", series(clock_events=int(ClockEvent.GPU_IDLE | ClockEvent.SYNC_BOOST | ClockEvent.CLOCKS_SETTING))
    )
    assert h.healthy


def test_several_reasons_in_order_and_one_finding_per_sick_gpu() -> None:
    sick = series(xid=lambda i: 48 if i > 5 else 0, ecc_dbe=lambda i: float(i > 5), clock_events=0x40)
    findings = job_health({"b gpu 1": sick, "a gpu 0": series(clock_events=0x4), "c gpu 2": series(xid=94)})
    assert [f.evidence["gpu"] for f in findings] == ["b gpu 1", "c gpu 2"]
    assert findings[0].evidence["reasons"] == ["xid", "ecc", "thermal"]
    assert findings[0].evidence["reason"] == "xid"


def test_absent_fields_are_no_evidence() -> None:
    h = evaluate_gpu("g", series())
    assert h.healthy and h.evidence == {"samples": 60}
    assert evaluate_gpu("g", []).healthy


def test_samples_from_either_spelling_of_the_exported_names() -> None:
    """dcgm-exporter's default CSV names and DCGM 4.6's current ones read alike; others are ignored."""
    t = [T0 + timedelta(seconds=15 * i) for i in range(3)]
    classic = {
        "DCGM_FI_DEV_XID_ERRORS": [(t[0], 0.0), (t[1], 79.0), (t[2], 79.0)],
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": [(t[0], 4.0), (t[1], 12.0), (t[2], float("nan"))],
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": [(t[0], 0.0), (t[1], 0.0), (t[2], 1.0)],
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": [(t[2], 0.0)],
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": [(t[0], 0.0), (t[2], 1.0)],
        "DCGM_FI_DEV_GPU_UTIL": [(t[0], 100.0)],
    }
    renamed = {
        {
            "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR",
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": "DCGM_FI_DEV_ROW_REMAP_FAILED",
        }.get(k, k): v
        for k, v in classic.items()
    }
    for series in (classic, renamed):
        samples = samples_from_series(series)
        assert samples == [
            HealthSample(t[0], xid=0, clock_events=4, ecc_dbe=0.0, remap_uncorrectable=0.0),
            HealthSample(t[1], xid=79, clock_events=12, remap_uncorrectable=0.0),
            HealthSample(t[2], xid=79, ecc_dbe=1.0, remap_uncorrectable=1.0, remap_failed=0.0),
        ]
        # one scrape of HW slowdown (0x8) is below the two-sample minimum
        assert evaluate_gpu("g", samples).reasons == ("xid", "ecc", "row_remap")
