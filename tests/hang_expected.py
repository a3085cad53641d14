"""Issue 33, part 4: the verdict each ``h200-hang`` phase implies, written BEFORE the auditor saw it.

Committed before the ``stalled`` rule existed and before the recording was replayed through the
auditor (git log shows the order): predictions from what each phase does to the GPU and from the
recorded counters in auditor/data/README.md's ``h200-hang`` section, not read off the auditor.

One H200 was lent, so the recording holds one rank. A multi-GPU job is built as the demo builds
its 4-GPU llm-finetune (auditor/cli/demo.py): the same phase replayed on every GPU of one pod
(``TraceJob(..., make_gpus(n, host), phase)``): each rank of a hung job reads what this one did.

``EXPECTED[(phase, gpus)] = (verdict, reason of the first finding)``.
"""

from __future__ import annotations

#: phases of the hung collective (blocks polling a flag that never changes)
HUNG = ("hung_spin_2sm", "hung_spin_8sm", "hung_spin_32sm")

EXPECTED: dict[tuple[str, int], tuple[str, str | None]] = {
    # every rank busy (util 100 %), SM = blocks/132, no pipe, no DRAM, idle power (122 W vs 121 W):
    # on 2 or 8 GPUs that is a collective that never completes -> stalled
    **{(p, n): ("low_sm_efficiency", "stalled") for p in HUNG for n in (2, 8)},
    # one GPU spinning on a few SMs is also the mission's one-SM example (a spin kernel): no
    # collective without a peer, so today's few_blocks finding stays
    ("hung_spin_2sm", 1): ("low_sm_efficiency", "few_blocks"),
    ("hung_spin_8sm", 1): ("low_sm_efficiency", "few_blocks"),
    # 32 blocks: SM 24 %, still below low_sm (0.5) and still no pipe, DRAM or power: NCCL runs one
    # block per channel (up to MAXCHANNELS = 64, NCCL's src/include/device.h; "32" before this
    # correction, the expectation itself unchanged), so a hang on 32 SMs is as much a hang as on 2
    ("hung_spin_32sm", 1): ("low_sm_efficiency", "few_blocks"),
    # memory held, no kernel: idle on any number of GPUs
    ("idle_memory_held", 1): ("idle", None),
    ("idle_memory_held", 2): ("idle", None),
    # a bf16 matmul at the power cap (tensor 93 %, 682 W): healthy, nowhere near the hang signature
    ("bf16_matmul_full_power", 1): ("healthy", None),
    ("bf16_matmul_full_power", 2): ("healthy", None),
}

#: the demo's DDP straggler (three ranks spinning on 4 blocks, one starved by its host: the
#: h200-demo-cluster phases the demo's llm-finetune replays) keeps its straggler headline
STRAGGLER = ("underutilized", "straggler")
