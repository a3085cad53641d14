"""Right-sizing on the recorded H200 workloads (issue 32, part 3): the expected answers, written
from what each workload runs (auditor/data/README.md and the truth files) before the rule was run
on them.

A workload *fits a slice* when it would run as fast on one: its memory is small and its GPU work
never needs more SMs or memory bandwidth than the slice has. Bursts that fill the GPU and then
wait (synchronous data loading, host compute between bursts, evaluation or checkpoint stalls)
do not fit: each burst would run several times longer on a slice, so the job slows down, though
its per-second SM activity is low. Idle jobs are not advised (release the GPU instead).

``FITS``: phase → the profiles that are an acceptable answer (any of them holds it).
``UNDECIDED``: phases whose truth we cannot tell from the recording, not asserted either way.
Every other recorded phase must get no advice.
"""

from __future__ import annotations

FITS: dict[str, dict[str, frozenset[str]]] = {
    "h200-workloads": {
        # 100 adds on 256 elements per step: launch-bound, no SM or memory to speak of
        "tiny_kernels_launch_bound": frozenset({"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb"}),
        # a 0.95 B-parameter model decoding at batch 1: 3.5 GB, tiny kernels, low bandwidth
        "llm_decode_bf16_batch1": frozenset({"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb"}),
        # 16 output tiles: 16 SMs have work, so a slice of 16 SMs or more holds it
        "few_sm_small_matmuls": frozenset({"2g.35gb", "3g.71gb", "4g.71gb"}),
    },
    "h200-mfu-workloads": {
        # a 0.54 B-parameter server at 0.25 and 1 request/s: idle between short generate calls
        "llm_server_poisson_0p25rps": frozenset({"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb"}),
        "llm_server_poisson_1p0rps": frozenset({"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb"}),
    },
    # the `infer` process alone (774 MiB, 66 % of the time busy, about 64 % of the SMs while
    # busy): its kernels fill most of the GPU while they run, so no slice holds it
    "h200-share": {},
}

UNDECIDED: dict[str, frozenset[str]] = {
    # 1 GiB host-to-device copies: no SM work, but a slice has fewer copy engines; the recording
    # cannot say whether its copies would slow
    "h200-workloads": frozenset({"h2d_copy_pinned"}),
    "h200-mfu-workloads": frozenset(),
    "h200-share": frozenset(),
}
