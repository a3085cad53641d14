"""DCGM source through pydcgm (ships with DCGM, not on PyPI): fields by numeric id.

The bindings live in ``/usr/share/datacenter-gpu-manager-4/bindings/python3`` (DCGM 4.x) or
``/usr/local/dcgm/bindings/python3`` (DCGM ≤ 3.3); both are put on ``sys.path`` when present
(``GPU_AUDITOR_DCGM_BINDINGS`` names another). Fields are watched by numeric id — DCGM 4.6
renamed every field and its Python bindings warn on (or reject) the old names, the ids never
changed. The agent first connects to a standalone host engine (``GPU_AUDITOR_DCGM_HOST``,
default ``127.0.0.1``, port 5555: the set-up NVIDIA recommends when dcgm-exporter also runs,
because the profiling hardware cannot be shared by two engines), else starts an embedded one.

DCGM is asked to update the fields every second; each tick reads the latest value of every field
(profiling fields are DCGM's own 1 s interval averages on Hopper+). Blank values (profiling not
yet ready, paused, or unsupported) are left out, never served as 0.

**Unverified:** this path has not run against a real DCGM (the validation H200 has none; see
docs/validation.md). It covers whole GPUs; MIG instances are served by the GPM source.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from auditor.agent.fields import FIELDS
from auditor.agent.sampler import Device, Sample
from auditor.errors import SourceUnavailable

log = logging.getLogger(__name__)

BINDING_DIRS = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
    "/usr/local/dcgm/bindings/python3",
)


def import_pydcgm() -> Any:
    """Import pydcgm from the DCGM install (either version's location); raise SourceUnavailable if absent."""
    extra = os.environ.get("GPU_AUDITOR_DCGM_BINDINGS")
    for path in ((extra,) if extra else ()) + BINDING_DIRS:
        if path and os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)
    try:
        import pydcgm  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001 - ImportError, or libdcgm.so missing (OSError) inside it
        raise SourceUnavailable(f"pydcgm not importable ({exc.__class__.__name__}: {exc})") from None
    return pydcgm


class DcgmSampler:
    """:class:`~auditor.agent.sampler.GpuSampler` over pydcgm (``name = "dcgm"``)."""

    name = "dcgm"

    def __init__(self, *, host: str | None = None, update_us: int = 1_000_000) -> None:
        pydcgm = import_pydcgm()
        try:
            import dcgm_fields  # type: ignore[import-not-found]
            import dcgm_structs  # type: ignore[import-not-found]
        except Exception as exc:  # noqa: BLE001
            raise SourceUnavailable(f"DCGM bindings incomplete: {exc}") from None
        self._fe_gpu = dcgm_fields.DCGM_FE_GPU
        self.errors = 0
        host = host if host is not None else os.environ.get("GPU_AUDITOR_DCGM_HOST", "127.0.0.1")
        self._handle = None
        try:
            try:
                self._handle = pydcgm.DcgmHandle(ipAddress=host, opMode=dcgm_structs.DCGM_OPERATION_MODE_AUTO)
                log.info("connected to DCGM host engine at %s", host)
            except Exception as exc:  # noqa: BLE001 - no standalone engine: run one embedded
                log.info("no DCGM host engine at %s (%s); starting an embedded one", host, exc)
                self._handle = pydcgm.DcgmHandle(ipAddress=None, opMode=dcgm_structs.DCGM_OPERATION_MODE_AUTO)
            system = self._handle.GetSystem()
            gpu_ids = list(system.discovery.GetAllSupportedGpuIds())
            if not gpu_ids:
                raise SourceUnavailable("DCGM sees no supported GPU")
            self._devices: dict[int, Device] = {}
            for gid in gpu_ids:
                attrs = system.discovery.GetGpuAttributes(gid)
                ident = attrs.identifiers
                self._devices[gid] = Device(
                    index=int(gid),
                    uuid=_text(ident.uuid),
                    model=_text(ident.deviceName),
                    pci_bus_id=_text(ident.pciBusId),
                )
            name = f"gpu-auditor-{os.getpid()}"
            self._group = system.GetGroupWithGpuIds(name, gpu_ids)
            self._ids = [f.dcgm_id for f in FIELDS]
            self._fg = pydcgm.DcgmFieldGroup(self._handle, name=name, fieldIds=self._ids)
            self._group.samples.WatchFields(self._fg, update_us, 60.0, 0)
        except SourceUnavailable:
            self.close()
            raise
        except Exception as exc:  # noqa: BLE001 - any DCGM error at start-up means: not usable
            self.close()
            raise SourceUnavailable(f"DCGM could not start watching fields: {exc}") from None
        self._by_id = {f.dcgm_id: f for f in FIELDS}

    def devices(self) -> list[Device]:
        return list(self._devices.values())

    def sample(self) -> Sample:
        dfvec = self._group.samples.GetLatest_v2(self._fg)
        per_gpu = dfvec.values.get(self._fe_gpu, {})
        out: dict[str, dict[str, float]] = {}
        for gid, dev in self._devices.items():
            values: dict[str, float] = {}
            for fid, series in per_gpu.get(gid, {}).items():
                field = self._by_id.get(fid)
                if field is None or len(series) == 0:
                    continue
                v = series[-1]
                if v.isBlank or v.value is None:
                    continue
                try:
                    values[field.name] = float(v.value)
                except (TypeError, ValueError):
                    self.errors += 1
            out[dev.key] = values
        return out

    def close(self) -> None:
        for attr in ("_fg", "_group"):
            obj = getattr(self, attr, None)
            if obj is not None:
                try:
                    obj.Delete()
                except Exception:  # noqa: BLE001 - best effort on shutdown
                    pass
                setattr(self, attr, None)
        if self._handle is not None:
            try:
                self._handle.Shutdown()
            except Exception:  # noqa: BLE001
                pass
            self._handle = None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
