"""NVML source (nvidia-ml-py, module ``pynvml``): GPM profiling metrics on Hopper+, else utilization only.

GPM (GPU Performance Monitoring) is what DCGM itself reads on Hopper and newer: two samples taken
some time apart give the average SM activity, occupancy, tensor, DRAM and pipe activity between
them. The agent takes one GPM sample per device every ``gpm_every`` ticks (``--profiling-interval``)
and computes the metrics between it and the previous one, so each value is a true average over
that interval (not a point read), and the first tick has no profiling values at all. One metric,
GR_ENGINE_ACTIVE, costs ~1 ms of CPU to compute (the others ~2 µs): it is computed every
``slow_every`` ticks (``--gr-engine-interval``), between the samples that far apart. GPM reports percents (0–100) and MiB/s; the
exported units come from :mod:`auditor.agent.fields`. A MIG instance is sampled with
``nvmlGpmMigSampleGet(parent, GPU_I_ID, …)``.

``gpm=False`` (or a GPU without GPM support) serves GPU and memory-copy utilization, power,
framebuffer and clocks only: the profiling series are absent, never zero.

Health (issue 33, every GPU, not per MIG instance): the clock-event reasons bitmask every tick
(one call); the volatile ECC totals and remapped rows every ``slow_every`` ticks (counters that
rarely move); Xid codes from an NVML event set registered for ``nvmlEventTypeXidCriticalError``,
drained without waiting every tick (one call for all GPUs), served as the last code seen, ``0``
until one is. A read the GPU or driver does not support is dropped after its first failure
(absent, never zero); a GPU whose Xid events cannot be registered serves no Xid series.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from auditor.agent.fields import GPM_FIELDS, AgentField
from auditor.agent.sampler import Device, Sample
from auditor.errors import SourceUnavailable

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def mig_profile(name: str) -> str:
    """``1g.18gb`` from a MIG device name such as ``NVIDIA H200 MIG 1g.18gb`` (dcgm-exporter's GPU_I_PROFILE)."""
    _, sep, tail = name.rpartition("MIG ")
    return tail.strip() if sep else ""


#: GPM metrics whose computation costs ~1 ms of CPU each (measured on an H200, driver 580:
#: GRAPHICS_UTIL 1,050 µs, every other exported metric 2–3 µs; bench/agent_cpu_bench.py). They
#: are computed every ``slow_every`` ticks, each value the average since its previous computation.
SLOW_GPM: frozenset[str] = frozenset({"DCGM_FI_PROF_GR_ENGINE_ACTIVE"})


class _Group:
    """GPM metrics computed together: the prepared request and the sample they start from.

    ``request`` is the ``nvmlGpmMetricsGet`` argument with its metric ids filled in once: a read
    only points it at two samples and makes one call for all of the group's metrics. ``anchor``
    is the GPM sample of the group's previous computation (``None`` until the first).
    """

    __slots__ = ("fields", "every", "request", "anchor")

    def __init__(self, fields: tuple[AgentField, ...], every: int, request: Any) -> None:
        self.fields, self.every, self.request = fields, every, request
        self.anchor: Any = None


class _Dev:
    """Handles, GPM sample buffers and metric groups of one device (internal).

    Each group keeps the sample it last computed from, so a device holds one buffer per group
    plus the one being filled. ``max_sm_clock`` is read once (a property of the board).
    """

    __slots__ = ("device", "handle", "parent", "gpm", "buffers", "groups", "max_sm_clock", "xid", "health")

    def __init__(self, device: Device, handle: Any, parent: Any) -> None:
        self.device, self.handle, self.parent = device, handle, parent
        self.gpm = False
        self.buffers: list[Any] = []
        self.groups: list[_Group] = []
        self.max_sm_clock: float | None = None
        #: the last Xid seen (0: none yet); None when Xid events are not registered for it
        self.xid: int | None = None
        #: the health reads this GPU still answers (a read that failed once is not asked again)
        self.health: set[str] = {"clock_events", "ecc", "remap"}

    def unheld_buffer(self) -> Any:
        """A sample buffer no group starts from (there is one more buffer than groups)."""
        return next(b for b in self.buffers if all(g.anchor is not b for g in self.groups))


class NvmlSampler:
    """:class:`~auditor.agent.sampler.GpuSampler` over NVML; ``name`` is ``gpm`` or ``nvml``."""

    def __init__(self, *, gpm: bool = True, gpm_every: int = 1, slow_every: int = 1) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise SourceUnavailable(f"nvidia-ml-py (pynvml) is not installed ({exc})") from None
        self.N = N = pynvml
        try:
            N.nvmlInit()
        except N.NVMLError as exc:
            raise SourceUnavailable(f"NVML could not start: {exc}") from None
        if gpm_every < 1 or slow_every < 1 or slow_every % gpm_every:
            raise SourceUnavailable(f"GPM every {gpm_every} and {slow_every} ticks: positive, the second a multiple")
        #: GPM metrics are computed every ``gpm_every`` ticks, those of SLOW_GPM every ``slow_every``
        self.gpm_every, self.slow_every = gpm_every, slow_every
        self._ticks = 0
        self.errors = 0
        self._devs: list[_Dev] = []
        self._events: Any = None
        try:
            self._discover(gpm)
        except N.NVMLError as exc:
            N.nvmlShutdown()
            raise SourceUnavailable(f"NVML device discovery failed: {exc}") from None
        if not self._devs:
            N.nvmlShutdown()
            raise SourceUnavailable("NVML sees no GPU")
        n_gpm = sum(d.gpm for d in self._devs)
        if gpm and not n_gpm:
            self.close()
            raise SourceUnavailable("no GPU supports NVML GPM (needs Hopper or newer and a recent driver)")
        if gpm and n_gpm < len(self._devs):
            log.warning(
                "GPM unsupported on %d of %d devices: their profiling series are absent",
                len(self._devs) - n_gpm,
                len(self._devs),
            )
        self.name = "gpm" if gpm else "nvml"
        try:
            self.driver = _text(N.nvmlSystemGetDriverVersion())
        except N.NVMLError:
            self.driver = ""

    # -- discovery ---------------------------------------------------------------------------
    def _discover(self, want_gpm: bool) -> None:
        N = self.N
        for i in range(N.nvmlDeviceGetCount()):
            h = N.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(N.nvmlDeviceGetUUID(h))
            model = _text(N.nvmlDeviceGetName(h))
            try:
                bus = _text(N.nvmlDeviceGetPciInfo(h).busId)
            except N.NVMLError:
                bus = ""
            gpu = _Dev(Device(index=i, uuid=uuid, model=model, pci_bus_id=bus), h, None)
            gpu.gpm = want_gpm and self._gpm_supported(h)
            self._devs.append(gpu)
            for mig in self._mig_devices(h):
                try:
                    gi = N.nvmlDeviceGetGpuInstanceId(mig)
                    mig_uuid = _text(N.nvmlDeviceGetUUID(mig))
                    profile = mig_profile(_text(N.nvmlDeviceGetName(mig)))
                except N.NVMLError as exc:
                    log.warning("GPU %d: MIG device unreadable (%s); skipped", i, exc)
                    continue
                d = _Dev(Device(i, uuid, model, bus, gi_id=str(gi), gi_profile=profile, mig_uuid=mig_uuid), mig, h)
                d.gpm = gpu.gpm
                self._devs.append(d)
        for d in self._devs:
            if not d.device.is_mig:
                d.max_sm_clock = self._max_sm_clock(d.handle)
            if d.gpm:
                fields = [f for f in GPM_FIELDS if f.mig or not d.device.is_mig]
                for every, part in (
                    (self.gpm_every, tuple(f for f in fields if f.name not in SLOW_GPM)),
                    (self.slow_every, tuple(f for f in fields if f.name in SLOW_GPM)),
                ):
                    if part:
                        d.groups.append(_Group(part, every, self._metrics_request(part)))
                d.buffers = [N.nvmlGpmSampleAlloc() for _ in range(len(d.groups) + 1)]
        self._register_xid()

    def _register_xid(self) -> None:
        """One event set for every GPU's Xid events (DCGM's own source of field 230)."""
        N = self.N
        if not all(hasattr(N, a) for a in ("nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2")):
            return
        try:
            self._events = N.nvmlEventSetCreate()
        except N.NVMLError as exc:
            log.warning("NVML event set unavailable (%s): no Xid series", exc)
            return
        for d in self._devs:
            if d.device.is_mig:
                continue
            try:
                N.nvmlDeviceRegisterEvents(d.handle, N.nvmlEventTypeXidCriticalError, self._events)
                d.xid = 0
            except N.NVMLError as exc:
                log.warning("GPU %d: Xid events not registered (%s): no Xid series", d.device.index, exc)

    def _metrics_request(self, fields: tuple[AgentField, ...]) -> Any:
        N = self.N
        request = N.c_nvmlGpmMetricsGet_t()
        request.version = N.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(fields)
        for i, f in enumerate(fields):
            request.metrics[i].metricId = f.gpm_id
        return request

    def _max_sm_clock(self, handle: Any) -> float | None:
        value = self._try(self.N.nvmlDeviceGetMaxClockInfo, handle, self.N.NVML_CLOCK_SM)
        return None if value is None else float(value)

    def _gpm_supported(self, handle: Any) -> bool:
        N = self.N
        if not hasattr(N, "nvmlGpmQueryDeviceSupport"):
            return False
        try:
            return bool(N.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except N.NVMLError:
            return False

    def _mig_devices(self, handle: Any) -> list[Any]:
        N = self.N
        try:
            current, _pending = N.nvmlDeviceGetMigMode(handle)
        except (N.NVMLError, AttributeError):
            return []
        if current != getattr(N, "NVML_DEVICE_MIG_ENABLE", 1):
            return []
        out = []
        for j in range(N.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                out.append(N.nvmlDeviceGetMigDeviceHandleByIndex(handle, j))
            except N.NVMLError:
                continue  # an empty slot
        return out

    @property
    def computed_every(self) -> int:
        """Ticks between two computations of the least often computed field (the agent holds
        each field's last value that long, so every scrape serves it)."""
        return self.slow_every

    # -- GpuSampler ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        return [d.device for d in self._devs]

    def sample(self) -> Sample:
        out: dict[str, dict[str, float]] = {}
        tick = self._ticks
        self._ticks += 1
        gpm_now = tick % self.gpm_every == 0
        self._drain_xid()
        for d in self._devs:
            values: dict[str, float] = {}
            if d.device.is_mig:
                self._read_mig(d, values)
            else:
                self._read_gpu(d, values)
                self._read_health(d, tick % self.slow_every == 0, values)
            if d.gpm and gpm_now:
                self._read_gpm(d, tick, values)
            out[d.device.key] = values
        return out

    def close(self) -> None:
        N = self.N
        if self._events is not None:
            try:
                N.nvmlEventSetFree(self._events)
            except N.NVMLError:
                pass
            self._events = None
        for d in self._devs:
            for s in d.buffers:
                try:
                    N.nvmlGpmSampleFree(s)
                except N.NVMLError:
                    pass
            d.buffers, d.groups = [], []
        self._devs = []
        try:
            N.nvmlShutdown()
        except N.NVMLError:
            pass

    # -- reads -------------------------------------------------------------------------------
    def _try(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.N.NVMLError:
            self.errors += 1
            return None

    def _read_gpu(self, d: _Dev, values: dict[str, float]) -> None:
        N, h = self.N, d.handle
        util = self._try(N.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            values["DCGM_FI_DEV_GPU_UTIL"] = float(util.gpu)
            values["DCGM_FI_DEV_MEM_COPY_UTIL"] = float(util.memory)
        self._read_memory(h, values)
        power = self._try(N.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            values["DCGM_FI_DEV_POWER_USAGE"] = power / 1000.0
        for name, clock in (("DCGM_FI_DEV_SM_CLOCK", N.NVML_CLOCK_SM), ("DCGM_FI_DEV_MEM_CLOCK", N.NVML_CLOCK_MEM)):
            v = self._try(N.nvmlDeviceGetClockInfo, h, clock)
            if v is not None:
                values[name] = float(v)
        if d.max_sm_clock is None:  # unreadable at discovery: try again, it is cheap to miss
            d.max_sm_clock = self._max_sm_clock(h)
        if d.max_sm_clock is not None:
            values["DCGM_FI_DEV_MAX_SM_CLOCK"] = d.max_sm_clock

    def _drain_xid(self) -> None:
        """Take every Xid event queued since the last tick, without waiting."""
        if self._events is None:
            return
        N = self.N
        by_index = {d.device.index: d for d in self._devs if not d.device.is_mig}
        for _ in range(64):  # a storm is bounded per tick; the rest waits for the next one
            try:
                event = N.nvmlEventSetWait_v2(self._events, 0)
            except N.NVMLError:
                return  # NVML_ERROR_TIMEOUT: none queued
            try:
                d = by_index.get(N.nvmlDeviceGetIndex(event.device))
            except N.NVMLError:
                d = None
            if d is not None and event.eventType & N.nvmlEventTypeXidCriticalError:
                d.xid = int(event.eventData)
                log.warning("GPU %d (%s): Xid %d", d.device.index, d.device.uuid, d.xid)

    def _health_read(self, d: _Dev, what: str, fn: Any, *args: Any) -> Any:
        """A health read; one that fails is not asked again (unsupported: absent, never zero)."""
        if what not in d.health or fn is None:
            return None
        try:
            return fn(*args)
        except self.N.NVMLError as exc:
            d.health.discard(what)
            log.info("GPU %d: %s unreadable (%s); not served", d.device.index, what, exc)
            return None

    def _read_health(self, d: _Dev, counters_now: bool, values: dict[str, float]) -> None:
        N, h = self.N, d.handle
        if d.xid is not None:
            values["DCGM_FI_DEV_XID_ERRORS"] = float(d.xid)
        reasons_fn = getattr(N, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            N, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        mask = self._health_read(d, "clock_events", reasons_fn, h)
        if mask is not None:
            values["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] = float(mask)
        if not counters_now:
            return
        ecc_fn = getattr(N, "nvmlDeviceGetTotalEccErrors", None)
        vol = getattr(N, "NVML_VOLATILE_ECC", 0)
        dbe = self._health_read(d, "ecc", ecc_fn, h, getattr(N, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), vol)
        sbe = self._health_read(d, "ecc", ecc_fn, h, getattr(N, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), vol)
        if dbe is not None and sbe is not None:
            values["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] = float(dbe)
            values["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] = float(sbe)
        rows = self._health_read(d, "remap", getattr(N, "nvmlDeviceGetRemappedRows", None), h)
        if rows is not None:
            corrected, uncorrected, _pending, failure = rows
            values["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] = float(corrected)
            values["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = float(uncorrected)
            values["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = float(failure)

    def _read_mig(self, d: _Dev, values: dict[str, float]) -> None:
        self._read_memory(d.handle, values)

    def _read_memory(self, handle: Any, values: dict[str, float]) -> None:
        mem = self._try(self.N.nvmlDeviceGetMemoryInfo, handle)
        if mem is not None:
            values["DCGM_FI_DEV_FB_USED"] = mem.used / 1048576.0
            values["DCGM_FI_DEV_FB_FREE"] = mem.free / 1048576.0

    def _read_gpm(self, d: _Dev, tick: int, values: dict[str, float]) -> None:
        """One GPM sample; each group due at ``tick`` gets its metrics since its previous sample.

        A group's first sample only starts its interval (no values yet); after a failed sample
        every group starts again, so no value ever spans a gap.
        """
        N = self.N
        cur = d.unheld_buffer()
        try:
            if d.device.is_mig:
                N.nvmlGpmMigSampleGet(d.parent, int(d.device.gi_id), cur)
            else:
                N.nvmlGpmSampleGet(d.handle, cur)
        except N.NVMLError:
            self.errors += 1
            for g in d.groups:
                g.anchor = None
            return
        for g in d.groups:
            if tick % g.every:
                continue
            if g.anchor is not None:
                self._metrics(g, g.anchor, cur, values)
            g.anchor = cur

    def _metrics(self, g: _Group, first: Any, second: Any, values: dict[str, float]) -> None:
        N = self.N
        mg = g.request
        mg.sample1, mg.sample2 = first, second
        try:
            N.nvmlGpmMetricsGet(mg)
        except N.NVMLError:
            self.errors += 1
            return
        metrics = mg.metrics
        for i, f in enumerate(g.fields):
            m = metrics[i]
            if m.nvmlReturn != 0 or not math.isfinite(m.value):
                continue  # unsupported metric on this device: absent, never 0
            values[f.name] = m.value * f.gpm_scale
