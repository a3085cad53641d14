"""MIG profiles per GPU model (issue 32, part 3): the slices right-sizing may advise.

A pure constant table, as :data:`auditor.core.mfu.DEFAULT_CLASSES` is: the core reads no files.

Origin (:data:`ORIGIN`, looked up 2026-12-03):

- Profile names, which GPUs support MIG and that a GPU has 7 compute slices: NVIDIA's
  *Multi-Instance GPU User Guide*, "Supported MIG Profiles"
  (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html) and
  "Supported GPUs" (…/supported-gpus.html).
- Memory (MiB) and SM count of each GPU-instance profile: NVIDIA's go-nvml NVML mock
  (github.com/NVIDIA/go-nvml, pkg/nvml/mock/shared/gpus/{h100,h200,a100}.go,
  ``GpuInstanceProfileInfo.MemorySizeMB`` / ``MultiprocessorCount``), which models what
  ``nvmlDeviceGetGpuInstanceProfileInfo`` returns. Its SM counts (16 for a 1g slice of an
  H100/H200, 112 for 7g) are what a slice gives a CUDA process; they are below the whole GPU's
  132 SMs, so a fit judged with them errs on the side of "does not fit".
- The whole GPU's SM count (``gpu_sms``): 132 for the H200 SXM was read on the device machine
  (auditor/data/README.md); the H100 SXM5 is the same GH100 configuration (Supported GPUs: both
  GH100, 7 instances). A100: 108 (the 98 of its 7g profile in the mock are a lower bound).

The ``+me`` profiles (media extensions) hold the same memory and SMs as their plain twins and
are left out; so are H100 NVL / 94 GB, H100 PCIe and B200, whose per-profile memory and SMs we
have from no NVIDIA file here (a model not in the table gets no MIG advice, never a guess).
"""

from __future__ import annotations

from dataclasses import dataclass

ORIGIN = (
    "NVIDIA Multi-Instance GPU User Guide, Supported MIG Profiles "
    "(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html); "
    "memory and SMs per profile from NVIDIA go-nvml pkg/nvml/mock/shared/gpus (2026-12-03)"
)

#: compute slices of a whole GPU on every model in the table
SLICES = 7


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile: ``name`` as nvidia-smi and the device plugin spell it
    (``nvidia.com/mig-<name>``), compute ``slices`` of :data:`SLICES`, memory and SMs."""

    name: str
    slices: int
    memory_mib: int
    sms: int


@dataclass(frozen=True, slots=True)
class MigModel:
    """A GPU model's profiles. ``match``: substrings of the exporter's ``modelName`` that select
    it (case-insensitive, all must occur), so "NVIDIA H100 80GB HBM3" and "NVIDIA H100 PCIe" stay
    apart; ``memory_mib``/``gpu_sms``: the whole GPU's."""

    name: str
    match: tuple[str, ...]
    memory_mib: int
    gpu_sms: int
    profiles: tuple[MigProfile, ...]

    def fraction(self, p: MigProfile) -> float:
        """The share of the GPU a profile takes from others: the larger of its compute slices
        and its memory (a 1g.35gb has one slice of SMs but a quarter of the memory, so only four
        fit), which is what right-sizing says is freed."""
        return max(p.slices / SLICES, p.memory_mib / self.memory_mib)

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)


MIG_MODELS: tuple[MigModel, ...] = (
    MigModel(
        "H200 141GB",
        ("h200",),
        144384,
        132,
        (
            MigProfile("1g.18gb", 1, 18432, 16),
            MigProfile("1g.35gb", 1, 35840, 16),
            MigProfile("2g.35gb", 2, 35840, 32),
            MigProfile("3g.71gb", 3, 72704, 48),
            MigProfile("4g.71gb", 4, 72704, 64),
            MigProfile("7g.141gb", 7, 144384, 112),
        ),
    ),
    MigModel(
        "H100 80GB",
        ("h100", "80gb"),
        81920,
        132,
        (
            MigProfile("1g.10gb", 1, 10240, 16),
            MigProfile("1g.20gb", 1, 20480, 16),
            MigProfile("2g.20gb", 2, 20480, 32),
            MigProfile("3g.40gb", 3, 40960, 48),
            MigProfile("4g.40gb", 4, 40960, 64),
            MigProfile("7g.80gb", 7, 81920, 112),
        ),
    ),
    MigModel(
        "A100 80GB",
        ("a100", "80gb"),
        81920,
        108,
        (
            MigProfile("1g.10gb", 1, 9856, 14),
            MigProfile("1g.20gb", 1, 19968, 14),
            MigProfile("2g.20gb", 2, 19968, 28),
            MigProfile("3g.40gb", 3, 40192, 42),
            MigProfile("4g.40gb", 4, 40192, 56),
            MigProfile("7g.80gb", 7, 80384, 98),
        ),
    ),
    MigModel(
        "A100 40GB",
        ("a100", "40gb"),
        40960,
        108,
        (
            MigProfile("1g.5gb", 1, 4864, 14),
            MigProfile("1g.10gb", 1, 9856, 14),
            MigProfile("2g.10gb", 2, 9856, 28),
            MigProfile("3g.20gb", 3, 19968, 42),
            MigProfile("4g.20gb", 4, 19968, 56),
            MigProfile("7g.40gb", 7, 40192, 96),
        ),
    ),
)


def mig_model(gpu_model: str | None, models: tuple[MigModel, ...] = MIG_MODELS) -> MigModel | None:
    """The table entry of an exporter's ``modelName`` (None: not in the table)."""
    if not gpu_model:
        return None
    low = gpu_model.lower()
    return next((m for m in models if all(s in low for s in m.match)), None)
