"""The verdict, and the first finding's reason, that each workload of the bundled
``h200-workloads`` trace (issue 15; auditor/data/README.md) must get: what its physics implies.
Shared by the replay test (tests/audit/test_trace_verdicts.py) and the Prometheus end-to-end test
(tests/audit/test_audit_traces.py)."""

#: the verdict each workload's physics implies
WORKLOADS = {
    "idle": "idle",
    "memory_held_no_work": "idle",
    "transformer_sdpa_bf16_s1024": "healthy",
    "transformer_materialized_bf16_s1024": "healthy",  # tensor 16 %: tensor_headroom, reason dram_busy
    "transformer_sdpa_bf16_s4096": "healthy",
    "transformer_materialized_bf16_s4096": "memory_bound",  # tensor 7.8 %, DRAM 67 %: MFU 0.078
    "transformer_sdpa_tf32_s1024": "healthy",
    "bf16_matmul": "healthy",
    "tf32_matmul": "healthy",
    "fp8_scaled_mm": "healthy",
    "dataloader_stall_busy20": "underutilized",
    "dataloader_stall_busy50": "underutilized",
    "dataloader_stall_busy80": "healthy",  # idle 23 %, SMs well used while busy: above busy_util
    "h2d_copy_pinned": "low_sm_efficiency",  # no kernel at all: copy_only, PCIe RX 59 GB/s
    "tiny_kernels_launch_bound": "underutilized",
    "transformer_sdpa_bf16_s1024_compiled": "healthy",
    "dataloader_stall_busy65_batch4": "underutilized",
    "host_compute_between_bursts": "underutilized",
    "llm_decode_bf16_batch1": "underutilized",
    "llm_decode_bf16_batch64": "underutilized",
    # launch gaps leave the GPU idle 30 % (SM 0.58: waste 42 %): above busy_util, but over a healthy
    # job's 35 % waste (issue 28: a healthy verdict never sits beside a waste that large)
    "transformer_sdpa_bf16_s1024_batch4": "underutilized",
    "transformer_sdpa_bf16_s1024_batch4_stall": "underutilized",
    "transformer_sdpa_bf16_s1024_batch8": "healthy",
    "resnet50_channels_last_bf16": "healthy",  # tensor 14 %, DRAM 47 %: tensor_headroom, reason dram_busy
    "few_sm_small_matmuls": "underutilized",  # 512³ products: 16 tiles, launch-bound
}
#: the first finding's reason (its advice) where the verdict has several
REASONS = {
    "transformer_materialized_bf16_s4096": "no_math_pipe",
    "dataloader_stall_busy20": "input_stall",
    "dataloader_stall_busy50": "input_stall",
    "dataloader_stall_busy65_batch4": "input_stall",
    "host_compute_between_bursts": "input_stall",
    "llm_decode_bf16_batch64": "input_stall",
    "tiny_kernels_launch_bound": "launch_bound",
    "llm_decode_bf16_batch1": "launch_bound",
    "h2d_copy_pinned": "no_kernel",
    "transformer_sdpa_bf16_s1024_batch4_stall": "input_stall",
    "few_sm_small_matmuls": "launch_bound",
}
