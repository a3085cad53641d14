"""Issue 28: the verdict each ``h200-mfu-workloads`` phase's physics implies, written BEFORE the recording.

Committed before any of these workloads ran on the H200 and before the auditor saw their data
(git log shows the order): these are predictions from what each workload does to the GPU, not
read off the auditor. Vocabulary: /tmp/brief/vocab.md as fixed for issue 28 (docs/verdicts.md).
``reason`` is the first finding's ``evidence.reason`` (``None`` for a healthy job without one).
Workload classes and kinds are those the truth file records (``workload_class``, ``kind``); the
references that make ``low_mfu`` possible exist for ``llm-training`` only (the brief: without a
reference a job is never ``low_mfu``), so the non-LLM trainings must come out as their physics
says, never ``low_mfu``.

The verdict tests (``tests/audit``) read ``EXPECTED`` and ``PAIRS``; ``bench/h200_mfu_workloads.py``
records the phases (auditor/data/README.md, section ``h200-mfu-workloads``).
"""

from __future__ import annotations

from typing import NamedTuple


class Expected(NamedTuple):
    verdict: str
    reason: str | None
    workload_class: str
    kind: str
    why: str


_LLM = ("llm-training", "PyTorchJob")

EXPECTED: dict[str, Expected] = {
    # -- fused/unfused pairs: GPT-style causal decoder, bf16, 6 layers, vocab 32768, 12,288 tokens a step
    "gpt_unfused_d1536_s2048": Expected(
        "low_mfu",
        "dram_busy",
        *_LLM,
        "eager materialised causal softmax (fp32) + spelled-out LN/GELU/dropout: every element-wise op a "
        "round trip to HBM, DRAM busy, tensor pipes underfed; MFU ~0.15-0.22, far below bf16 LLM training's 0.35-0.45",
    ),
    "gpt_fused_d1536_s2048": Expected(
        "healthy", None, *_LLM, "the same model with flash SDPA + torch.compile: MFU ~0.45, at the reference"
    ),
    "gpt_unfused_d2048_s1024": Expected(
        "low_mfu",
        "dram_busy",
        *_LLM,
        "wider model, shorter sequence: attention's share smaller, but the spelled-out GELU on 4d-wide "
        "activations and the dropouts still make it DRAM-bound; MFU ~0.20, below 0.6 x the reference",
    ),
    "gpt_fused_d2048_s1024": Expected("healthy", None, *_LLM, "SDPA + compile at d 2048: big matmuls, MFU ~0.5"),
    "gpt_unfused_d1024_s3072": Expected(
        "low_mfu",
        "dram_busy",
        *_LLM,
        "long sequence, narrow model: the s^2 score tensors (fp32 softmax, mask, dropout) dominate the "
        "traffic, DRAM saturated, tensor pipes ~0.1-0.15; MFU ~0.10-0.15 (the lowest of the three)",
    ),
    "gpt_fused_d1024_s3072": Expected(
        "healthy", None, *_LLM, "flash attention never writes the scores; MFU ~0.4 (narrower matmuls)"
    ),
    # -- periodic stalls of a healthy bf16 training (the first pair's fused model)
    "gpt_ckpt_sync_period20s": Expected(
        "underutilized",
        "periodic_stall",
        *_LLM,
        "13 s of healthy training, then a 7 s synchronous checkpoint (state to host, torch.save, fsync; "
        "memory held, no kernel): a square wave, busy ~65 %, idle phases ~35 % of the time",
    ),
    "gpt_ckpt_sync_period40s": Expected(
        "underutilized",
        "periodic_stall",
        *_LLM,
        "28 s of training, 12 s checkpoint: the same square wave at twice the period, idle ~30 %",
    ),
    "gpt_eval_stall_period24s": Expected(
        "underutilized",
        "periodic_stall",
        *_LLM,
        "16 s of training, 8 s of evaluation (batch-1 forwards, logits scored on the host with numpy): "
        "the GPU nearly idle a third of the time in phases of seconds",
    ),
    # -- host-offloaded optimizer
    "gpt_zero_offload_cpu_adam": Expected(
        "underutilized",
        "host_offload",
        *_LLM,
        "ZeRO-offload: grads down, Adam on the CPU (fp32 master weights), bf16 weights up every step: "
        "PCIe busy both ways (~0.5-1 GB/s each), the GPU idle >85 % waiting on the host",
    ),
    # -- inference servers, Poisson arrivals
    "llm_server_poisson_0p25rps": Expected(
        "underutilized",
        "serving",
        "llm-inference",
        "Deployment",
        "one request every 4 s on average, ~0.4 s each: GPU busy ~10 %, idle between requests",
    ),
    "llm_server_poisson_1p0rps": Expected(
        "underutilized",
        "serving",
        "llm-inference",
        "Deployment",
        "one request a second: busy ~40 %, still idle between requests and launch-bound decoding while busy",
    ),
    # -- latency-bound kernels (FP32, no tensor cores)
    "fp32_one_warp_per_sm_ilp2": Expected(
        "low_sm_efficiency",
        "low_occupancy",
        "microbench",
        "Job",
        "132 blocks of 32 threads: every SM active, one warp of 64 resident (occupancy ~0.016), two "
        "dependent FMA chains: FP32 pipe ~0.1-0.2, latency-bound",
    ),
    "fp32_register_limited": Expected(
        "low_sm_efficiency",
        "low_occupancy",
        "microbench",
        "Job",
        "168 live floats a thread (~190 registers): the register file holds one 256-thread block per SM, "
        "8 warps of 64 (occupancy 0.125, the floor registers can force) on a dependent FMA->rsqrt chain: "
        "FP32 pipe low, latency-bound; the cure is fewer registers per thread, not bf16",
    ),
    # -- non-LLM trainings: no LLM reference applies, never low_mfu
    "convnext_tiny_bf16_autocast": Expected(
        "healthy",
        None,
        "cnn-training",
        "PyTorchJob",
        "ConvNeXt-T, batch 128, channels_last, bf16 autocast: SMs busy, tensor pipes in use (depthwise 7x7 "
        "convs and LayerNorms keep MFU moderate, ~0.2-0.3), which is normal for the class",
    ),
    "dlrm_embeddingbag_sparse_sgd": Expected(
        "memory_bound",
        "no_math_pipe",
        "recsys-training",
        "PyTorchJob",
        "8 x 4 M x 128 fp32 tables, bags of 32, sparse gradients: gathers, sorts and scattered updates, "
        "almost no math (MLPs tiny); DRAM-bound with idle math pipes, MFU near 0 and not an MFU problem",
    ),
    "unet_diffusion_bf16_autocast": Expected(
        "healthy",
        None,
        "diffusion-training",
        "PyTorchJob",
        "a 128/256/512-channel UNet on 4x64x64 latents, bf16 autocast: convolution-heavy, tensor pipes "
        "busy, MFU ~0.25-0.4, normal for the class",
    ),
}

#: fused/unfused pairs (same model FLOPs a step): the unfused job is flagged ``low_mfu``, its fused
#: twin is ``healthy``, and the unfused job's recoverable GPU-hours are within 25 % of what the fused
#: twin saves (the truth file's ``pairs[tag].saved_fraction`` x the unfused job's GPU-hours)
PAIRS: dict[str, tuple[str, str]] = {
    "d1536_s2048": ("gpt_unfused_d1536_s2048", "gpt_fused_d1536_s2048"),
    "d2048_s1024": ("gpt_unfused_d2048_s1024", "gpt_fused_d2048_s1024"),
    "d1024_s3072": ("gpt_unfused_d1024_s3072", "gpt_fused_d1024_s3072"),
}
