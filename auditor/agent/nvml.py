"""NVML source (nvidia-ml-py, module ``pynvml``): GPM profiling metrics on Hopper+, else utilization only.

GPM (GPU Performance Monitoring) is what DCGM itself reads on Hopper and newer: two samples taken
some time apart give the average SM activity, occupancy, tensor, DRAM and pipe activity between
them. The agent takes one GPM sample per device per tick and computes the metrics between this
tick's sample and the previous one, so each value is a true 1 s average (not a point read), and
the first tick has no profiling values at all. GPM reports percents (0–100) and MiB/s; the
exported units come from :mod:`auditor.agent.fields`. A MIG instance is sampled with
``nvmlGpmMigSampleGet(parent, GPU_I_ID, …)``.

``gpm=False`` (or a GPU without GPM support) serves GPU and memory-copy utilization, power,
framebuffer and clocks only: the profiling series are absent, never zero.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from auditor.agent.fields import GPM_FIELDS
from auditor.agent.sampler import Device, Sample
from auditor.errors import SourceUnavailable

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def mig_profile(name: str) -> str:
    """``1g.18gb`` from a MIG device name such as ``NVIDIA H200 MIG 1g.18gb`` (dcgm-exporter's GPU_I_PROFILE)."""
    _, sep, tail = name.rpartition("MIG ")
    return tail.strip() if sep else ""


class _Dev:
    """Handles and GPM sample buffers of one device (internal)."""

    __slots__ = ("device", "handle", "parent", "gpm", "prev", "cur", "has_prev")

    def __init__(self, device: Device, handle: Any, parent: Any) -> None:
        self.device, self.handle, self.parent = device, handle, parent
        self.gpm = False
        self.prev = self.cur = None
        self.has_prev = False


class NvmlSampler:
    """:class:`~auditor.agent.sampler.GpuSampler` over NVML; ``name`` is ``gpm`` or ``nvml``."""

    def __init__(self, *, gpm: bool = True) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise SourceUnavailable(f"nvidia-ml-py (pynvml) is not installed ({exc})") from None
        self.N = N = pynvml
        try:
            N.nvmlInit()
        except N.NVMLError as exc:
            raise SourceUnavailable(f"NVML could not start: {exc}") from None
        self.errors = 0
        self._devs: list[_Dev] = []
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
        self._gpm_ids = [f.gpm_id for f in GPM_FIELDS]
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
            if d.gpm:
                d.prev, d.cur = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()

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

    # -- GpuSampler ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        return [d.device for d in self._devs]

    def sample(self) -> Sample:
        out: dict[str, dict[str, float]] = {}
        for d in self._devs:
            values: dict[str, float] = {}
            if d.device.is_mig:
                self._read_mig(d, values)
            else:
                self._read_gpu(d, values)
            if d.gpm:
                self._read_gpm(d, values)
            out[d.device.key] = values
        return out

    def close(self) -> None:
        N = self.N
        for d in self._devs:
            for s in (d.prev, d.cur):
                if s is not None:
                    try:
                        N.nvmlGpmSampleFree(s)
                    except N.NVMLError:
                        pass
            d.prev = d.cur = None
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
        for name, fn, clock in (
            ("DCGM_FI_DEV_SM_CLOCK", N.nvmlDeviceGetClockInfo, N.NVML_CLOCK_SM),
            ("DCGM_FI_DEV_MEM_CLOCK", N.nvmlDeviceGetClockInfo, N.NVML_CLOCK_MEM),
            ("DCGM_FI_DEV_MAX_SM_CLOCK", N.nvmlDeviceGetMaxClockInfo, N.NVML_CLOCK_SM),
        ):
            v = self._try(fn, h, clock)
            if v is not None:
                values[name] = float(v)

    def _read_mig(self, d: _Dev, values: dict[str, float]) -> None:
        self._read_memory(d.handle, values)

    def _read_memory(self, handle: Any, values: dict[str, float]) -> None:
        mem = self._try(self.N.nvmlDeviceGetMemoryInfo, handle)
        if mem is not None:
            values["DCGM_FI_DEV_FB_USED"] = mem.used / 1048576.0
            values["DCGM_FI_DEV_FB_FREE"] = mem.free / 1048576.0

    def _read_gpm(self, d: _Dev, values: dict[str, float]) -> None:
        """GPM metrics between the previous tick's sample and this one (none on the first tick)."""
        N = self.N
        try:
            if d.device.is_mig:
                N.nvmlGpmMigSampleGet(d.parent, int(d.device.gi_id), d.cur)
            else:
                N.nvmlGpmSampleGet(d.handle, d.cur)
        except N.NVMLError:
            self.errors += 1
            d.has_prev = False
            return
        if d.has_prev:
            fields = [f for f in GPM_FIELDS if f.mig or not d.device.is_mig]
            mg = N.c_nvmlGpmMetricsGet_t()
            mg.version = N.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(fields)
            mg.sample1, mg.sample2 = d.prev, d.cur
            for i, f in enumerate(fields):
                mg.metrics[i].metricId = f.gpm_id
            try:
                N.nvmlGpmMetricsGet(mg)
            except N.NVMLError:
                self.errors += 1
            else:
                for i, f in enumerate(fields):
                    m = mg.metrics[i]
                    if m.nvmlReturn != 0 or not math.isfinite(m.value):
                        continue  # unsupported metric on this device: absent, never 0
                    values[f.name] = m.value * f.gpm_scale
        d.prev, d.cur = d.cur, d.prev
        d.has_prev = True
