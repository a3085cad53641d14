"""The one interface every GPU source implements, and the choice of the best one present.

Sources, best first: pydcgm (DCGM installed: its profiling fields by numeric id), NVML GPM
(nvidia-ml-py on Hopper and newer), plain NVML (utilization, power, memory, clocks: the
profiling series are then *absent*, never zero). Tests and the CI replay recorded samples
through the same interface (:class:`auditor.agent.recorded.RecordedSampler`), so everything above
the sampler — aggregation, attribution, exposition, a real Prometheus scraping it — is exercised
without a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Protocol, runtime_checkable

from auditor.errors import BadInput, SourceUnavailable

log = logging.getLogger(__name__)

SOURCES = ("auto", "dcgm", "gpm", "nvml")


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU, or one MIG instance of a GPU, labelled as dcgm-exporter labels it.

    ``uuid`` and ``index`` are the *parent* GPU's (dcgm-exporter puts them on MIG series too);
    ``gi_id``/``gi_profile`` name the MIG GPU instance (empty for a whole GPU) and ``mig_uuid``
    its ``MIG-…`` UUID, which is how the device plugin names a MIG device to the kubelet.
    """

    index: int
    uuid: str
    model: str
    pci_bus_id: str = ""
    gi_id: str = ""
    gi_profile: str = ""
    mig_uuid: str = ""

    @property
    def key(self) -> str:
        """Parent UUID, plus ``/GPU_I_ID`` for a MIG instance (as :class:`auditor.core.model.GpuId`)."""
        return f"{self.uuid}/{self.gi_id}" if self.gi_id else self.uuid

    @property
    def is_mig(self) -> bool:
        return bool(self.gi_id)


#: one sample: device key → {field name → value in the exported unit}; a missing field is absent
Sample = Mapping[str, Mapping[str, float]]


@runtime_checkable
class GpuSampler(Protocol):
    """A source of 1 s GPU samples.

    ``name`` is what the agent reports as its backend (``dcgm``, ``gpm``, ``nvml``, ``recorded``).
    ``devices()`` lists the GPUs and MIG instances (fixed for the sampler's life: a MIG
    reconfiguration needs an agent restart, as it does for dcgm-exporter). ``sample()`` reads
    every device once; a field that could not be read is left out, never set to 0. A failure of
    one device must not fail the others; ``sample()`` raises only when nothing can be read.

    A source that computes some field only every k ticks may say so with an optional
    ``computed_every`` attribute (k; 1 when absent): the agent then serves that field's last value
    at the scrapes in between (:class:`~auditor.agent.window.SampleWindow`, ``hold``).
    """

    name: str

    def devices(self) -> list[Device]: ...

    def sample(self) -> Sample: ...

    def close(self) -> None: ...


def open_sampler(source: str = "auto", *, gpm_every: int = 1, slow_every: int = 1) -> GpuSampler:
    """The sampler for ``source`` (``auto`` = the best one present).

    ``gpm_every``/``slow_every``: NVML GPM computes its profiling metrics on every
    ``gpm_every``-th sample and the costly GR_ENGINE_ACTIVE on every ``slow_every``-th, each the
    average since its previous computation (docs/agent.md "Cost"); DCGM paces its own profiling
    and ignores both.

    ``auto`` tries pydcgm, then NVML with GPM, then NVML alone, and logs why each better one was
    skipped. Naming a source that cannot start raises :class:`SourceUnavailable` with the reason.
    """
    if source not in SOURCES:
        raise BadInput(f"--source {source!r}: choose one of {', '.join(SOURCES)}")
    reasons: list[str] = []
    if source in ("auto", "dcgm"):
        from auditor.agent.dcgm import DcgmSampler

        try:
            return DcgmSampler()
        except SourceUnavailable as exc:
            if source == "dcgm":
                raise
            reasons.append(f"dcgm: {exc}")
            log.info("pydcgm not usable (%s); trying NVML GPM", exc)
    from auditor.agent.nvml import NvmlSampler

    if source in ("auto", "gpm"):
        try:
            return NvmlSampler(gpm=True, gpm_every=gpm_every, slow_every=slow_every)
        except SourceUnavailable as exc:
            if source == "gpm":
                raise
            reasons.append(f"gpm: {exc}")
            log.warning("NVML GPM not usable (%s); trying NVML utilization only (profiling series absent)", exc)
    try:
        return NvmlSampler(gpm=False)
    except SourceUnavailable as exc:
        reasons.append(f"nvml: {exc}")
        raise SourceUnavailable("no GPU source could start: " + "; ".join(reasons)) from exc
