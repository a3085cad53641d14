"""Record issue 28's MFU workloads on one GPU (an H200): fused/unfused pairs, periodic stalls,
an offloaded optimizer, inference servers, latency-bound kernels and three non-LLM trainings.

Each phase runs through ``bench/h200_workloads.py``'s recorder (our own node agent, NVML GPM,
scraped once a second: one CSV row a second with the phase that ran during it) and writes the
same CSV columns as ``auditor/data/h200-workloads.csv``. The truth file holds, per workload, its
steps, wall time and measured MFU (model FLOPs / wall time / the dense peak of its precision),
its ``workload_class`` and Kubernetes ``kind``, and per fused/unfused pair the steps-per-second
ratio and ``saved_fraction`` = 1 − (unfused steps/s)/(fused steps/s): what the fused twin saves,
the truth for "recoverable GPU-hours".

    PYTHONPATH=$PWD python3 bench/h200_mfu_workloads.py --group llm    # $OUT/h200-mfu-workloads-llm.{csv,truth.json,log}
    PYTHONPATH=$PWD python3 bench/h200_mfu_workloads.py --group other  # $OUT/h200-mfu-workloads-other.{...}

Why these shapes: see auditor/data/README.md, section ``h200-mfu-workloads``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_h200_validation import log, sh
from h200_workloads import PEAK_TFLOPS, Recorder, finish_recording, mfu_fields, start_recording, timed

VOCAB = 32768
DROP = 0.1
#: the fused/unfused pairs: (d_model, heads, seq, batch); every pair 6 layers and 12,288 tokens a step
PAIRS = ((1536, 12, 2048, 6), (2048, 16, 1024, 12), (1024, 8, 3072, 4))
LAYERS = 6
LLM_TRAIN = {"workload_class": "llm-training", "kind": "PyTorchJob"}


# -- the GPT-style decoder ------------------------------------------------------------------------
def gpt(d: int, heads: int, layers: int, seq: int, fused: bool, compile_: bool | None = None) -> tuple[Any, Any]:
    """A GPT-style causal decoder (token + position embeddings, pre-norm blocks, untied LM head), bf16.

    The same module code for both twins. ``fused=False``: eager, attention materialised
    (``q @ kᵀ`` → causal mask → softmax in fp32 → dropout → ``@ v``), layer norm, tanh-GELU and
    dropout spelled out as element-wise ops, each its own kernel and its own round trip to HBM.
    ``fused=True``: the same blocks with ``F.scaled_dot_product_attention(is_causal, dropout_p)``
    (flash attention) and ``torch.compile`` per block (regional compilation: one compiled graph
    for the six identical blocks), so Inductor fuses the element-wise work. Same parameters, same
    model FLOPs. ``compile_=False`` keeps SDPA but leaves the blocks eager. Returns (model, AdamW).
    """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def dropout(x: torch.Tensor) -> torch.Tensor:
        keep = torch.rand(x.shape, device=x.device, dtype=torch.float32) >= DROP
        return x * keep.to(x.dtype) * (1.0 / (1.0 - DROP))

    class LayerNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w, self.b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            xf = x.float()
            mu = xf.mean(-1, keepdim=True)
            var = ((xf - mu) * (xf - mu)).mean(-1, keepdim=True)
            return ((xf - mu) * torch.rsqrt(var + 1e-5)).to(x.dtype) * self.w + self.b

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = LayerNorm(), LayerNorm()
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            if not fused:
                self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            if fused:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=DROP if self.training else 0.0)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // heads))
                att = att.masked_fill(self.mask[:s, :s], float("-inf"))
                att = torch.softmax(att.float(), dim=-1).to(q.dtype)
                if self.training:
                    att = dropout(att)
                y = att @ v
            y = self.proj(y.transpose(1, 2).reshape(b, s, d))
            x = x + (dropout(y) if self.training else y)
            h = self.fc1(self.n2(x))
            h = 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))
            h = self.fc2(h)
            return x + (dropout(h) if self.training else h)

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = LayerNorm()
            self.head = nn.Linear(d, VOCAB, bias=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))

    model = GPT().to("cuda", torch.bfloat16)
    if fused if compile_ is None else compile_:
        for blk in model.blocks:
            blk.compile()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


def gpt_flops(b: int, s: int, d: int, layers: int) -> float:
    """Model FLOPs of one training step: 3 × forward; per layer 2·tokens·12d² (QKV, projection,
    MLP) + 4·b·s²·d (QKᵀ and AV counted whole, as PaLM's MFU does, causal or not), plus the LM
    head 2·tokens·d·vocab. Embeddings, norms, softmax, dropout and the optimizer are not counted."""
    tokens = b * s
    return 3.0 * (layers * (24.0 * tokens * d * d + 4.0 * b * s * s * d) + 2.0 * tokens * d * VOCAB)


def gpt_step(model: Any, opt: Any, b: int, s: int) -> Callable[[], None]:
    import torch
    import torch.nn.functional as F

    ids = torch.randint(0, VOCAB, (b, s + 1), device="cuda")

    def step() -> None:
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.view(-1, VOCAB).float(), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def free(*_: Any) -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def periodic(
    rec: Recorder,
    name: str,
    periods: int,
    busy_s: float,
    step: Callable[[], None],
    stall: Callable[[], float],
) -> dict:
    """``periods`` times: train ``busy_s`` seconds, then ``stall()`` (it returns its own measure)."""
    import torch

    rec.phase = name
    t0 = time.perf_counter()
    steps, stalls, measured = 0, [], []
    for _ in range(periods):
        b0 = time.perf_counter()
        while time.perf_counter() - b0 < busy_s:
            step()
            steps += 1
            if steps % 4 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        s0 = time.perf_counter()
        measured.append(stall())
        stalls.append(time.perf_counter() - s0)
    wall = time.perf_counter() - t0
    rec.phase = "gap"
    time.sleep(2.0)
    return {
        "steps": steps,
        "wall_s": round(wall, 2),
        "periods": len(stalls),
        "busy_s": busy_s,
        "stall_s": [round(x, 2) for x in stalls],
        "stall_measured_s": [round(x, 2) for x in measured],
    }


def with_mfu(out: dict, flops_per_step: float, precision: str) -> dict:
    out.update(mfu_fields(flops_per_step * out["steps"], out["wall_s"], precision))
    log(f"{out}")
    return out


# -- group llm: the pairs, checkpoint and evaluation stalls -----------------------------------------
def run_llm(rec: Recorder, seconds: float, res: dict, pairs: dict) -> None:
    import torch

    keep: Any = None
    for d, heads, s, b in PAIRS:
        tag = f"d{d}_s{s}"
        flops = gpt_flops(b, s, d, LAYERS)
        shape = {"batch": b, "seq": s, "d_model": d, "heads": heads, "layers": LAYERS, "vocab": VOCAB, **LLM_TRAIN}
        for fused in (False, True):
            name = f"gpt_{'fused' if fused else 'unfused'}_{tag}"
            try:
                model, opt = gpt(d, heads, LAYERS, s, fused)
                step = gpt_step(model, opt, b, s)
                t0 = time.perf_counter()
                rec.phase = "warmup"
                step()
                torch.cuda.synchronize()
                log(f"{name}: first step (compile) {time.perf_counter() - t0:.1f} s")
                res[name] = timed(
                    rec, name, step, seconds, warmup=3, flops_per_step=flops, precision="bf16", extra=shape
                )
                res[name]["first_step_s"] = round(time.perf_counter() - t0, 1)
                res[name]["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
                torch.cuda.reset_peak_memory_stats()
            except Exception as exc:  # noqa: BLE001 - record what failed, carry on
                log(f"{name} failed: {traceback.format_exc()}")
                res[name] = {"error": repr(exc), **shape}
                model = opt = step = None
            if fused and d == PAIRS[0][0]:
                keep = (model, opt, step, b, s, d, flops)  # the healthy model the stalls interrupt
            else:
                del model, opt, step
            free()
        u, f = res.get(f"gpt_unfused_{tag}", {}), res.get(f"gpt_fused_{tag}", {})
        if "steps" in u and "steps" in f:
            us, fs = u["steps"] / u["wall_s"], f["steps"] / f["wall_s"]
            pairs[tag] = {
                "unfused": f"gpt_unfused_{tag}",
                "fused": f"gpt_fused_{tag}",
                "unfused_steps_per_s": round(us, 3),
                "fused_steps_per_s": round(fs, 3),
                "speedup": round(fs / us, 3),
                "saved_fraction": round(1.0 - us / fs, 4),
            }
            log(f"pair {tag}: {pairs[tag]}")

    if keep is None or keep[0] is None:
        return
    model, opt, step, b, s, d, flops = keep
    shape = {"batch": b, "seq": s, "d_model": d, "layers": LAYERS, **LLM_TRAIN}
    ckdir = Path(os.environ.get("CKPT_DIR", "/tmp/ckpt"))
    ckdir.mkdir(parents=True, exist_ok=True)

    def to_host(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.detach().to("cpu")
        if isinstance(x, dict):
            return {k: to_host(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(to_host(v) for v in x)
        return x

    def checkpoint(target_s: float) -> Callable[[], float]:
        """A synchronous checkpoint: model + optimizer state to host, torch.save, fsync; GPU memory
        stays held. Padded with a sleep to ``target_s`` (a slower shared filesystem) when the local
        disk is faster; returns the real write's duration."""

        def stall() -> float:
            t0 = time.perf_counter()
            state = {"model": to_host(model.state_dict()), "optim": to_host(opt.state_dict())}
            path = ckdir / "ckpt.pt"
            with open(path, "wb") as fh:
                torch.save(state, fh)
                fh.flush()
                os.fsync(fh.fileno())
            real = time.perf_counter() - t0
            del state
            path.unlink()
            time.sleep(max(0.0, target_s - real))
            return real

        return stall

    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3
    for name, busy, stall_s, periods in (
        ("gpt_ckpt_sync_period20s", 13.0, 7.0, 3),
        ("gpt_ckpt_sync_period40s", 28.0, 12.0, 3),
    ):
        try:
            out = periodic(rec, name, periods, busy, step, checkpoint(stall_s))
            out.update(shape, stall_target_s=stall_s, state_gib=round(state_bytes / 2**30, 2))
            res[name] = with_mfu(out, flops, "bf16")
        except Exception as exc:  # noqa: BLE001
            log(f"{name} failed: {traceback.format_exc()}")
            res[name] = {"error": repr(exc)}


# -- group other: evaluation stall, offload, servers, kernels, non-LLM ----------------------------------
def eval_stall(rec: Recorder) -> dict:
    """The first pair's model with SDPA, eager (no compile: no recompiles for the eval shapes),
    training 16 s, then 8 s of evaluation: batch-1 forward passes whose logits go to the host and
    are scored there with numpy (the GPU mostly idle, memory held), three times."""
    import numpy as np
    import torch

    d, heads, s, b = PAIRS[0]
    model, opt = gpt(d, heads, LAYERS, s, fused=True, compile_=False)
    step = gpt_step(model, opt, b, s)
    ids = torch.randint(0, VOCAB, (1, s), device="cuda")

    def evaluate(target_s: float = 8.0) -> float:
        model.eval()
        t0, n = time.perf_counter(), 0
        with torch.no_grad():
            while time.perf_counter() - t0 < target_s:
                logits = model(ids).float().cpu().numpy()[0]
                z = logits - logits.max(-1, keepdims=True)
                nll = np.log(np.exp(z[:-1]).sum(-1)) - z[np.arange(s - 1), ids[0, 1:].cpu().numpy()]
                float(nll.mean())
                n += 1
        model.train()
        return float(n)

    rec.phase = "warmup"
    for _ in range(3):
        step()
    evaluate(1.0)
    out = periodic(rec, "gpt_eval_stall_period24s", 3, 16.0, step, evaluate)
    out.update(batch=b, seq=s, d_model=d, layers=LAYERS, eval_s=8.0, eval_batches=out.pop("stall_measured_s"))
    out.update(LLM_TRAIN)
    return with_mfu(out, gpt_flops(b, s, d, LAYERS), "bf16")


def zero_offload(rec: Recorder) -> dict:
    """ZeRO-offload style: bf16 weights on the GPU, fp32 master weights and Adam on the CPU;
    each step grads go down to pinned host buffers and the updated weights come back up."""
    import torch

    d, heads, s, b = 1536, 12, 1024, 8
    model, _ = gpt(d, heads, 4, s, fused=True, compile_=False)  # eager SDPA: the GPU part is not the point
    params = [p for p in model.parameters()]
    master = [p.detach().float().cpu().requires_grad_(True) for p in params]
    grads = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in params]
    up = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in params]
    adam = torch.optim.Adam(master, lr=1e-4, foreach=True)
    ids = torch.randint(0, VOCAB, (b, s + 1), device="cuda")

    def step() -> None:
        logits = model(ids[:, :-1])
        torch.nn.functional.cross_entropy(logits.view(-1, VOCAB).float(), ids[:, 1:].reshape(-1)).backward()
        for p, g in zip(params, grads):
            g.copy_(p.grad, non_blocking=True)
            p.grad = None
        torch.cuda.synchronize()
        for m, g in zip(master, grads):
            m.grad = g.float()
        adam.step()
        for m, u, p in zip(master, up, params):
            u.copy_(m.detach())
            p.data.copy_(u, non_blocking=True)
        torch.cuda.synchronize()

    nbytes = sum(p.numel() * p.element_size() for p in params)
    out = timed(
        rec,
        "gpt_zero_offload_cpu_adam",
        step,
        36.0,
        warmup=2,
        flops_per_step=gpt_flops(b, s, d, 4),
        precision="bf16",
        extra={"batch": b, "seq": s, "d_model": d, "layers": 4, "bytes_each_way_per_step": nbytes, **LLM_TRAIN},
    )
    out["pcie_gb_per_s_each_way"] = round(nbytes * out["steps"] / out["wall_s"] / 1e9, 2)
    return out


def servers(rec: Recorder) -> dict:
    """An inference server (transformers Llama, random weights, bf16) answering Poisson arrivals:
    each request 1, 2 or 4 prompts of 128 tokens, 32 new tokens, served FIFO; idle between."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=32000,
        max_position_embeddings=2048,
    )
    with torch.device("cuda"):
        llm = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    params = sum(p.numel() for p in llm.parameters())
    prompts = {n: torch.randint(0, 32000, (n, 128), device="cuda") for n in (1, 2, 4)}

    def serve(n: int) -> None:
        with torch.no_grad():
            llm.generate(prompts[n], max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()

    rec.phase = "warmup"
    for n in (1, 2, 4):
        serve(n)
    t0 = time.perf_counter()
    serve(1)
    service_s = time.perf_counter() - t0
    res: dict = {}
    for rate, seconds in ((0.25, 48.0), (1.0, 40.0)):
        name = f"llm_server_poisson_{str(rate).replace('.', 'p')}rps"
        rng = random.Random(28)
        rec.phase = name
        t0 = time.perf_counter()
        nxt = t0 + rng.expovariate(rate)
        served, tokens, prompts_n, waits = 0, 0, 0, []
        while True:
            now = time.perf_counter()
            if now - t0 >= seconds:
                break
            if now < nxt:
                time.sleep(min(nxt - now, t0 + seconds - now))
                continue
            n = rng.choice((1, 2, 4))
            serve(n)
            waits.append(time.perf_counter() - nxt)
            served += 1
            prompts_n += n
            tokens += n * (128 + 32)
            nxt += rng.expovariate(rate)
        wall = time.perf_counter() - t0
        rec.phase = "gap"
        time.sleep(2.0)
        tflops = 2.0 * params * tokens / wall / 1e12
        res[name] = {
            "steps": served,
            "wall_s": round(wall, 2),
            "arrival_rate_per_s": rate,
            "prompts": prompts_n,
            "service_s_batch1": round(service_s, 3),
            "mean_latency_s": round(statistics.fmean(waits), 3) if waits else None,
            "params": params,
            "precision": "bf16",
            "achieved_tflops": round(tflops, 2),
            "peak_tflops": PEAK_TFLOPS["bf16"],
            "mfu": round(tflops / PEAK_TFLOPS["bf16"], 5),
            "workload_class": "llm-inference",
            "kind": "Deployment",
        }
        log(f"{name}: {res[name]}")
    return res


ONE_WARP = r"""
extern "C" __global__ void one_warp_ilp2(float* out, long long iters) {
    float a = threadIdx.x * 1e-3f, b = a + 1.0f;
    for (long long i = 0; i < iters; ++i) {
        a = fmaf(a, 0.9999f, 1e-4f);
        b = fmaf(b, 0.9999f, 1e-4f);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a + b;
}
"""

REG_HEAVY = r"""
#define NREG 168
extern "C" __global__ void __launch_bounds__(256, 1) reg_heavy(float* out, int iters) {
    float r[NREG];
    #pragma unroll
    for (int j = 0; j < NREG; ++j) r[j] = 1.0f + (threadIdx.x + j) * 1e-4f;
    float x = 1.0f;
    for (int i = 0; i < iters; ++i) {
        #pragma unroll
        for (int j = 0; j < NREG; ++j) {
            x = rsqrtf(fmaf(x, r[j], 1.0f));
            r[j] = r[j] + 1e-7f;
        }
    }
    float acc = x;
    #pragma unroll
    for (int j = 0; j < NREG; ++j) acc += r[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
"""


def kernels(rec: Recorder, sms: int) -> dict:
    """Two latency-bound FP32 kernels (cupy RawKernel): one warp per SM with two independent FMA
    chains; and a register-heavy kernel (168 live floats a thread, ``__launch_bounds__(256, 1)``)
    launched with 8 blocks per SM of work, of which the register file holds one at a time."""
    import cupy as cp

    res: dict = {}
    out = cp.zeros(sms * 8 * 256, dtype=cp.float32)
    one = cp.RawKernel(ONE_WARP, "one_warp_ilp2")
    iters = 20_000_000
    res["fp32_one_warp_per_sm_ilp2"] = timed(
        rec,
        "fp32_one_warp_per_sm_ilp2",
        lambda: (one((sms,), (32,), (out, cp.int64(iters))), cp.cuda.Device().synchronize()),
        24.0,
        warmup=1,
        flops_per_step=2.0 * 2 * iters * sms * 32,
        precision="fp32",
        extra={"blocks": sms, "threads_per_block": 32, "iters": iters, "workload_class": "microbench", "kind": "Job"},
    )
    reg = cp.RawKernel(REG_HEAVY, "reg_heavy", options=("-maxrregcount=255",))
    it2 = 4000
    blocks = sms * 8
    res["fp32_register_limited"] = timed(
        rec,
        "fp32_register_limited",
        lambda: (reg((blocks,), (256,), (out, cp.int32(it2))), cp.cuda.Device().synchronize()),
        24.0,
        warmup=1,
        flops_per_step=3.0 * it2 * 168 * blocks * 256,  # an FMA (2) and an add (1) per register a pass
        precision="fp32",
        extra={
            "blocks": blocks,
            "threads_per_block": 256,
            "iters": it2,
            "registers_per_thread": reg.num_regs,
            "local_bytes_per_thread": reg.local_size_bytes,
            "workload_class": "microbench",
            "kind": "Job",
        },
    )
    return res


def counted(step: Callable[[], None]) -> float:
    """FLOPs of one step as torch.utils.flop_counter counts them (matmuls and convolutions)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return float(counter.get_total_flops())


def bf16_training(
    rec: Recorder | None, name: str, seconds: float, net: Any, loss: Callable[[], Any], extra: dict
) -> dict:
    """Train ``net`` on ``loss()`` under bf16 autocast with fused AdamW (``rec=None``: count only).

    Model FLOPs a step = 3 × the forward's as FlopCounterMode counts it (the MFU convention;
    ``flops_counted_step`` is its count of a whole step, kept for comparison: torch 2.11's counter
    takes a grouped convolution's weight gradient as ungrouped, which inflates it ~3x on ConvNeXt's
    depthwise convolutions)."""
    import torch

    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            value = loss()
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def forward() -> None:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            loss()

    counts = {"flops_per_step": 3.0 * counted(forward), "flops_counted_step": counted(step)}
    if rec is None:
        return counts
    return timed(
        rec, name, step, seconds, flops_per_step=counts["flops_per_step"], precision="bf16", extra={**extra, **counts}
    )


def convnext(rec: Recorder | None, seconds: float) -> dict:
    import torch
    import torchvision

    net = torchvision.models.convnext_tiny().to("cuda", memory_format=torch.channels_last)
    x = torch.randn(128, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (128,), device="cuda")
    return bf16_training(
        rec,
        "convnext_tiny_bf16_autocast",
        seconds,
        net,
        lambda: torch.nn.functional.cross_entropy(net(x), y),
        {"batch": 128, "image": 224, "workload_class": "cnn-training", "kind": "PyTorchJob"},
    )


def dlrm(rec: Recorder, seconds: float) -> dict:
    """DLRM-style: 8 EmbeddingBag tables of 4 M rows × 128 (fp32, sparse gradients, SGD), bags of
    32 ids; bottom MLP on 13 dense features, dot-product interaction, top MLP; MLPs in bf16."""
    import torch
    import torch.nn as nn

    tables, rows, dim, bag, batch = 8, 4_000_000, 128, 32, 32768

    class DLRM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) for _ in range(tables))
            self.bottom = nn.Sequential(
                nn.Linear(13, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, dim)
            )
            n = (tables + 1) * tables // 2 + dim
            self.top = nn.Sequential(
                nn.Linear(n, 1024),
                nn.ReLU(),
                nn.Linear(1024, 1024),
                nn.ReLU(),
                nn.Linear(1024, 512),
                nn.ReLU(),
                nn.Linear(512, 1),
            )

        def forward(self, dense: torch.Tensor, ids: list[torch.Tensor]) -> torch.Tensor:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                z = self.bottom(dense)
            feats = torch.stack([z.float()] + [e(i) for e, i in zip(self.emb, ids)], dim=1)
            inter = torch.bmm(feats, feats.transpose(1, 2))
            iu = torch.triu_indices(tables + 1, tables + 1, offset=1, device=dense.device)
            flat = inter[:, iu[0], iu[1]]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return self.top(torch.cat([z, flat.to(z.dtype)], dim=1)).float()

    with torch.device("cuda"):
        net = DLRM()
    sparse = torch.optim.SGD(list(net.emb.parameters()), lr=0.01)
    dense_opt = torch.optim.Adam(list(net.bottom.parameters()) + list(net.top.parameters()), lr=1e-3, fused=True)
    g = torch.Generator(device="cuda").manual_seed(28)
    batches = []
    for _ in range(4):
        ids = [(torch.rand(batch, bag, device="cuda", generator=g) ** 3 * rows).long() for _ in range(tables)]  # skewed
        batches.append((torch.randn(batch, 13, device="cuda"), ids, torch.rand(batch, 1, device="cuda").round()))
    k = [0]

    def step() -> None:
        dense, ids, label = batches[k[0] % len(batches)]
        k[0] += 1
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(dense, ids), label)
        loss.backward()
        sparse.step()
        dense_opt.step()
        sparse.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)

    # MLP matmuls and the interaction's bmm, 3 × forward (the bags' sums are not FLOPs MFU counts)
    mlp = [
        (13, 512),
        (512, 256),
        (256, dim),
        ((tables + 1) * tables // 2 + dim, 1024),
        (1024, 1024),
        (1024, 512),
        (512, 1),
    ]
    flops = 3.0 * (2.0 * batch * sum(i * o for i, o in mlp) + 2.0 * batch * (tables + 1) ** 2 * dim)
    return timed(
        rec,
        "dlrm_embeddingbag_sparse_sgd",
        step,
        seconds,
        flops_per_step=flops,
        precision="bf16",
        extra={
            "batch": batch,
            "tables": tables,
            "rows": rows,
            "dim": dim,
            "bag": bag,
            "embedding_gib": round(tables * rows * dim * 4 / 2**30, 1),
            "flops_per_step": flops,
            "workload_class": "recsys-training",
            "kind": "PyTorchJob",
        },
    )


def unet(rec: Recorder | None, seconds: float) -> dict:
    """A hand-written diffusion UNet (ε-prediction on 4×64×64 latents): channels 128/256/512, two
    residual blocks a level (GroupNorm, SiLU, 3×3 convs, timestep embedding), self-attention at
    16×16 and in the middle; bf16 autocast, channels_last, AdamW."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Res(nn.Module):
        def __init__(self, cin: int, cout: int, temb: int) -> None:
            super().__init__()
            self.n1, self.c1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
            self.t = nn.Linear(temb, cout)
            self.n2, self.c2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            h = self.c1(F.silu(self.n1(x))) + self.t(t)[:, :, None, None]
            h = self.c2(F.dropout(F.silu(self.n2(h)), 0.1, self.training))
            return h + self.skip(x)

    class Attn(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.n, self.qkv, self.o = nn.GroupNorm(32, c), nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            b, c, hh, ww = x.shape
            q, k, v = self.qkv(self.n(x)).reshape(b, 3, 8, c // 8, hh * ww).permute(1, 0, 2, 4, 3)
            y = F.scaled_dot_product_attention(q, k, v).permute(0, 1, 3, 2).reshape(b, c, hh, ww)
            return x + self.o(y)

    class UNet(nn.Module):
        def __init__(self, chs: tuple[int, ...] = (128, 256, 512), temb: int = 512) -> None:
            super().__init__()
            self.temb = nn.Sequential(nn.Linear(128, temb), nn.SiLU(), nn.Linear(temb, temb))
            self.inp = nn.Conv2d(4, chs[0], 3, padding=1)
            self.down, self.up = nn.ModuleList(), nn.ModuleList()
            skips, c = [chs[0]], chs[0]
            for i, co in enumerate(chs):
                for _ in range(2):
                    self.down.append(Res(c, co, temb))
                    c = co
                    skips.append(c)
                    if i == len(chs) - 1:
                        self.down.append(Attn(c))
                if i < len(chs) - 1:
                    self.down.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
                    skips.append(c)
            self.mid = nn.ModuleList([Res(c, c, temb), Attn(c), Res(c, c, temb)])
            for i, co in reversed(list(enumerate(chs))):
                for _ in range(3):
                    self.up.append(Res(c + skips.pop(), co, temb))
                    c = co
                    if i == len(chs) - 1:
                        self.up.append(Attn(c))
                if i > 0:
                    self.up.append(nn.Upsample(scale_factor=2))
            self.out = nn.Sequential(nn.GroupNorm(32, c), nn.SiLU(), nn.Conv2d(c, 4, 3, padding=1))

        def forward(self, x: torch.Tensor, ts: torch.Tensor) -> torch.Tensor:
            half = torch.exp(-math.log(10000.0) * torch.arange(64, device=x.device) / 64)
            t = self.temb(torch.cat([torch.sin(ts[:, None] * half), torch.cos(ts[:, None] * half)], dim=1))
            h = self.inp(x)
            hs = [h]
            for m in self.down:
                h = m(h, t) if isinstance(m, (Res, Attn)) else m(h)
                if not isinstance(m, Attn):
                    hs.append(h)
            for m in self.mid:
                h = m(h, t)
            for m in self.up:
                if isinstance(m, Res):
                    h = m(torch.cat([h, hs.pop()], dim=1), t)
                elif isinstance(m, Attn):
                    h = m(h, t)
                else:
                    h = m(h)
            return self.out(h)

    net = UNet().to("cuda", memory_format=torch.channels_last)
    batch = 64
    x0 = torch.randn(batch, 4, 64, 64, device="cuda").to(memory_format=torch.channels_last)

    def loss() -> torch.Tensor:
        ts = torch.randint(0, 1000, (batch,), device="cuda").float()
        noise = torch.randn_like(x0)
        a = torch.cos(ts / 1000 * math.pi / 2)[:, None, None, None]
        return F.mse_loss(net(a * x0 + (1 - a * a).sqrt() * noise, ts).float(), noise)

    return bf16_training(
        rec,
        "unet_diffusion_bf16_autocast",
        seconds,
        net,
        loss,
        {
            "batch": batch,
            "latent": "4x64x64",
            "params": sum(p.numel() for p in net.parameters()),
            "workload_class": "diffusion-training",
            "kind": "PyTorchJob",
        },
    )


def run_eval(rec: Recorder, seconds: float, res: dict, pairs: dict) -> None:
    """The evaluation stall alone, and the FLOP counts of the two counted trainings (no phase)."""
    try:
        res["gpt_eval_stall_period24s"] = eval_stall(rec)
    except Exception as exc:  # noqa: BLE001
        log(f"eval failed: {traceback.format_exc()}")
        res["gpt_eval_stall_period24s"] = {"error": repr(exc)}
    free()
    for name, fn in (("convnext_tiny_bf16_autocast", convnext), ("unet_diffusion_bf16_autocast", unet)):
        res[f"{name}_flops"] = fn(None, 0.0)
        log(f"{name}: {res[f'{name}_flops']}")
        free()


def run_other(rec: Recorder, seconds: float, res: dict, pairs: dict) -> None:
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name, fn in (
        ("gpt_eval_stall_period24s", lambda: eval_stall(rec)),
        ("gpt_zero_offload_cpu_adam", lambda: zero_offload(rec)),
        ("servers", lambda: servers(rec)),
        ("kernels", lambda: kernels(rec, sms)),
        ("convnext_tiny_bf16_autocast", lambda: convnext(rec, seconds)),
        ("dlrm_embeddingbag_sparse_sgd", lambda: dlrm(rec, seconds)),
        ("unet_diffusion_bf16_autocast", lambda: unet(rec, seconds)),
    ):
        try:
            out = fn()
            res.update(out if name in ("servers", "kernels") else {name: out})
        except Exception as exc:  # noqa: BLE001 - record what failed, carry on
            log(f"{name} failed: {traceback.format_exc()}")
            res[name] = {"error": repr(exc)}
        free()


def smoke() -> None:
    """What the machine has, before anything long runs (printed to the log)."""
    import torch

    torch.cuda.set_device(0)
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, cuda {torch.version.cuda}")
    log(sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.used,clocks.max.sm,power.limit", "--format=csv"]))
    log(f"cpus {os.cpu_count()}, disk {sh(['df', '-h', '/tmp'])}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", choices=["llm", "other", "eval"], default="llm")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each steady phase")
    args = ap.parse_args()
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    smoke()
    # GR_ENGINE_ACTIVE computed every second too: every row is a true 1 s mean of every series
    agent, rec = start_recording("--gr-engine-interval", "1s")
    t_start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res: dict = {}
    pairs: dict = {}

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)  # `timeout` stops a long run: keep what was recorded
    try:
        rec.phase = "idle"
        time.sleep(4)
        {"llm": run_llm, "other": run_other, "eval": run_eval}[args.group](rec, args.seconds, res, pairs)
    except KeyboardInterrupt as exc:
        log(f"interrupted ({exc}): writing what was recorded")
        res["interrupted"] = {"phase": rec.phase, "why": str(exc)}
    finally:
        truth = {"recorded": [t_start, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())]}
        finish_recording(rec, agent, f"h200-mfu-workloads-{args.group}", {**truth, "workloads": res, "pairs": pairs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
