"""Record labelled traces of real workloads on one GPU (an H200), with each workload's measured MFU.

The sensor is our own node agent (``python -m auditor.agent --source auto --interval 1s``, GPM on
Hopper without DCGM), scraped once a second as its own scraper, like Prometheus would: each scrape
is the mean of the agent's 1 s samples since the previous one, so the CSV has one row a second with
the ``phase`` that ran during it. Each workload warms up unrecorded (phase ``warmup``), then runs for
``--seconds`` under its own phase name, then a 2 s ``gap``.

MFU is model FLOPs (an analytic count, below) over the phase's wall time, against the dense peak of
the precision the workload runs in (``PEAK_TFLOPS``, H100/H200 SXM datasheet values).

    PYTHONPATH=$PWD python3 bench/h200_workloads.py --group core   # writes $OUT/h200-workloads-core.{csv,truth.json}

Needs torch and nvidia-ml-py (+ prometheus-client for parsing); transformers for the ``extra``
group's decoding phases.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_h200_validation import AgentProcess, log, sh

#: dense peaks, TFLOP/s, H100/H200 SXM (NVIDIA datasheets; the sparse figures are twice these)
PEAK_TFLOPS = {"bf16": 989.4, "tf32": 494.7, "fp8": 1978.9, "fp32": 66.9}

#: agent series → CSV column (value factor to the CSV's unit: percents for activities)
SERIES = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_copy_util_pct", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active_pct", 100.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy_pct", 100.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active_pct", 100.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active_pct", 100.0),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("fp32_active_pct", 100.0),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("fp16_active_pct", 100.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active_pct", 100.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_FB_USED": ("fb_used_mib", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MAX_SM_CLOCK": ("max_sm_clock_mhz", 1.0),
}
COLUMNS = ["t", "phase", *[c for c, _ in SERIES.values()]]


class Recorder:
    """Scrapes the agent once a second in a thread; ``phase`` is whatever runs at the time."""

    def __init__(self, agent: AgentProcess, uuid: str) -> None:
        self.agent, self.uuid = agent, uuid
        self.phase = "warmup"
        self.rows: list[dict] = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        self.agent.scrape("recorder")
        nxt = time.time() + 1.0
        while not self.stop.is_set():
            time.sleep(max(0.0, nxt - time.time()))
            nxt += 1.0
            phase = self.phase
            try:
                series = self.agent.scrape("recorder")
            except OSError as exc:
                log(f"scrape failed: {exc}")
                continue
            row: dict = {"t": round(time.time(), 3), "phase": phase}
            for n, labels, v in series:
                if n in SERIES and labels.get("UUID") == self.uuid and not labels.get("GPU_I_ID"):
                    col, f = SERIES[n]
                    row[col] = round(v * f, 3) if f != 1.0 or "pct" in col else round(v, 1)
            self.rows.append(row)


def mfu_fields(flops: float, wall_s: float, precision: str) -> dict:
    """Measured MFU of ``flops`` model FLOPs done in ``wall_s`` seconds, against the dense peak of
    ``precision``: the truth files' precision, achieved_tflops, peak_tflops and mfu."""
    tflops = flops / wall_s / 1e12
    return {
        "precision": precision,
        "achieved_tflops": round(tflops, 1),
        "peak_tflops": PEAK_TFLOPS[precision],
        "mfu": round(tflops / PEAK_TFLOPS[precision], 4),
    }


def timed(
    rec: Recorder,
    name: str,
    step,
    seconds: float,
    warmup: int = 3,
    flops_per_step: float = 0.0,
    precision: str | None = None,
    extra: dict | None = None,
) -> dict:
    """Warm ``step`` up, run it for ``seconds`` under phase ``name``; FLOPs/time → MFU."""
    import torch

    rec.phase = "warmup"
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    rec.phase = name
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    rec.phase = "gap"
    out: dict = {"steps": n, "wall_s": round(wall, 2), **(extra or {})}
    if flops_per_step and precision:
        out.update(mfu_fields(flops_per_step * n, wall, precision))
    log(f"{name}: {out}")
    time.sleep(2.0)
    return out


# -- workloads ----------------------------------------------------------------------------------
def transformer(d: int, heads: int, layers: int, attention: str, dtype, compile_: bool = False):
    """A pre-norm transformer encoder stack trained with AdamW on random embeddings (no vocab).

    ``attention`` is ``sdpa`` (F.scaled_dot_product_attention: flash attention) or ``materialized``
    (matmul → softmax in fp32 → matmul, the scores written to memory). Non-causal, so both do
    the same FLOPs. Returns (module, optimizer).
    """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            if attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / (d // heads) ** 0.5)
                y = torch.softmax(att.float(), dim=-1).to(q.dtype) @ v
            x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
            return x + self.fc2(F.gelu(self.fc1(self.n2(x))))

    model = nn.Sequential(*[Block() for _ in range(layers)]).to("cuda", dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model) if compile_ else model
    return fwd, opt, model


def transformer_flops(b: int, s: int, d: int, layers: int) -> float:
    """Model FLOPs of one training step (forward + backward = 3 × forward), non-causal attention:
    per layer 2·tokens·12d² (QKV, proj, MLP) + 4·b·s²·d (QKᵀ and AV)."""
    tokens = b * s
    return 3.0 * layers * (2.0 * tokens * 12 * d * d + 4.0 * b * s * s * d)


def train_step_fn(fwd, opt, b: int, s: int, d: int, dtype):
    import torch

    x = torch.randn(b, s, d, device="cuda", dtype=dtype)

    def step() -> None:
        out = fwd(x)
        loss = out.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def step_seconds(step, *, warm: int, n: int) -> float:
    """Mean wall time of one synchronised ``step`` after ``warm`` unmeasured ones."""
    import torch

    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def stalled_step(step, pause: float):
    """``step``, then the host waits ``pause`` seconds with the GPU idle (a data-loader stall)."""
    import torch

    def stalled() -> None:
        step()
        torch.cuda.synchronize()
        time.sleep(pause)

    return stalled


def run_core(rec: Recorder, seconds: float) -> dict:
    import torch

    res: dict = {}
    bf16 = torch.bfloat16
    rec.phase = "idle"
    time.sleep(8)
    res["idle"] = {}

    held = torch.empty(40 * 1024**3, dtype=torch.uint8, device="cuda")
    held.fill_(1)
    torch.cuda.synchronize()
    rec.phase = "memory_held_no_work"
    time.sleep(seconds)
    rec.phase = "gap"
    res["memory_held_no_work"] = {"held_gib": 40}
    del held
    torch.cuda.empty_cache()
    time.sleep(2)

    d, heads, layers = 1024, 16, 4
    for s, b in ((1024, 16), (4096, 4)):
        for attn in ("sdpa", "materialized"):
            fwd, opt, model = transformer(d, heads, layers, attn, bf16)
            step = train_step_fn(fwd, opt, b, s, d, bf16)
            name = f"transformer_{attn}_bf16_s{s}"
            res[name] = timed(
                rec,
                name,
                step,
                seconds,
                flops_per_step=transformer_flops(b, s, d, layers),
                precision="bf16",
                extra={"batch": b, "seq": s, "d_model": d, "heads": heads, "layers": layers},
            )
            del fwd, opt, model, step
            torch.cuda.empty_cache()

    # fp32 weights with TF32 matmuls (the same model, SDPA, s=1024)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    fwd, opt, model = transformer(d, heads, layers, "sdpa", torch.float32)
    step = train_step_fn(fwd, opt, 32, 1024, d, torch.float32)
    res["transformer_sdpa_tf32_s1024"] = timed(
        rec,
        "transformer_sdpa_tf32_s1024",
        step,
        seconds,
        flops_per_step=transformer_flops(32, 1024, d, layers),
        precision="tf32",
        extra={"batch": 32, "seq": 1024, "d_model": d, "heads": heads, "layers": layers},
    )
    del fwd, opt, model, step
    torch.cuda.empty_cache()

    # plain matrix products: the calibration of tensor activity per FLOP for each precision
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=bf16)
    bm = torch.randn(n, n, device="cuda", dtype=bf16)
    res["bf16_matmul"] = timed(
        rec,
        "bf16_matmul",
        lambda a=a, bm=bm: torch.mm(a, bm),
        seconds,
        warmup=10,
        flops_per_step=2.0 * n**3,
        precision="bf16",
        extra={"n": n},
    )
    af, bf = a.float(), bm.float()
    res["tf32_matmul"] = timed(
        rec,
        "tf32_matmul",
        lambda af=af, bf=bf: torch.mm(af, bf),
        seconds,
        warmup=10,
        flops_per_step=2.0 * n**3,
        precision="tf32",
        extra={"n": n},
    )
    del af, bf
    try:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = bm.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major, as _scaled_mm wants
        one = torch.tensor(1.0, device="cuda")

        def fp8() -> None:
            torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=bf16)

        fp8()
        res["fp8_scaled_mm"] = timed(
            rec, "fp8_scaled_mm", fp8, seconds, warmup=10, flops_per_step=2.0 * n**3, precision="fp8", extra={"n": n}
        )
    except Exception as exc:  # noqa: BLE001
        log(f"fp8 unsupported: {exc!r}")
        res["fp8_scaled_mm"] = {"error": repr(exc)}
    del a, bm
    torch.cuda.empty_cache()

    # data-loader stalls: the s=1024 SDPA step, then the host sleeps so the GPU is busy ~f of the time
    fwd, opt, model = transformer(d, heads, layers, "sdpa", bf16)
    step = train_step_fn(fwd, opt, 32, 1024, d, bf16)
    t_step = step_seconds(step, warm=3, n=10)
    for f in (0.2, 0.5, 0.8):
        pause = t_step * (1 - f) / f
        stalled = stalled_step(step, pause)
        name = f"dataloader_stall_busy{int(f * 100)}"
        res[name] = timed(
            rec,
            name,
            stalled,
            seconds,
            warmup=1,
            flops_per_step=transformer_flops(32, 1024, d, layers),
            precision="bf16",
            extra={"target_busy": f, "gpu_step_s": round(t_step, 4), "sleep_s": round(pause, 4)},
        )
    del fwd, opt, model, step
    torch.cuda.empty_cache()

    # host→device copies from pinned memory, nothing else
    src = torch.empty(1024**3, dtype=torch.uint8, pin_memory=True)
    src.fill_(3)
    dst = torch.empty(1024**3, dtype=torch.uint8, device="cuda")
    r = timed(rec, "h2d_copy_pinned", lambda dst=dst, src=src: dst.copy_(src, non_blocking=True), seconds, warmup=3)
    r["gb_per_s"] = round(r["steps"] * 1024**3 / r["wall_s"] / 1e9, 1)
    res["h2d_copy_pinned"] = r
    del src, dst
    torch.cuda.empty_cache()

    # many tiny kernels, launched back to back (launch-bound)
    x = torch.zeros(256, device="cuda")

    def tiny() -> None:
        for _ in range(100):
            x.add_(1.0)

    res["tiny_kernels_launch_bound"] = timed(rec, "tiny_kernels_launch_bound", tiny, seconds, warmup=5)
    return res


def run_extra(rec: Recorder, seconds: float) -> dict:
    import torch

    res: dict = {}
    bf16 = torch.bfloat16
    d, heads, layers = 1024, 16, 4
    fwd, opt, model = transformer(d, heads, layers, "sdpa", bf16, compile_=True)
    step = train_step_fn(fwd, opt, 32, 1024, d, bf16)
    t0 = time.perf_counter()
    rec.phase = "warmup"
    step()
    torch.cuda.synchronize()
    log(f"compile took {time.perf_counter() - t0:.1f} s")
    res["transformer_sdpa_bf16_s1024_compiled"] = timed(
        rec,
        "transformer_sdpa_bf16_s1024_compiled",
        step,
        seconds,
        flops_per_step=transformer_flops(32, 1024, d, layers),
        precision="bf16",
        extra={"batch": 32, "seq": 1024, "d_model": d, "heads": heads, "layers": layers},
    )
    del fwd, opt, model, step
    torch.cuda.empty_cache()

    # an input stall at ~65 % busy with a smaller batch (SMs less full while busy)
    fwd, opt, model = transformer(d, heads, layers, "sdpa", bf16)
    step = train_step_fn(fwd, opt, 4, 1024, d, bf16)
    t_step = step_seconds(step, warm=5, n=20)
    pause = t_step * 0.35 / 0.65
    stalled = stalled_step(step, pause)
    res["dataloader_stall_busy65_batch4"] = timed(
        rec,
        "dataloader_stall_busy65_batch4",
        stalled,
        seconds,
        warmup=1,
        flops_per_step=transformer_flops(4, 1024, d, layers),
        precision="bf16",
        extra={"target_busy": 0.65, "gpu_step_s": round(t_step, 4), "sleep_s": round(pause, 4), "batch": 4},
    )
    del fwd, opt, model, step
    torch.cuda.empty_cache()

    # host-side compute (numpy on the CPU) between GPU bursts
    import numpy as np

    a = torch.randn(8192, 8192, device="cuda", dtype=bf16)
    host = np.random.rand(1500, 1500)

    def bursty(a: torch.Tensor = a) -> None:
        for _ in range(20):
            torch.mm(a, a)
        torch.cuda.synchronize()
        np.linalg.inv(host)

    res["host_compute_between_bursts"] = timed(
        rec,
        "host_compute_between_bursts",
        bursty,
        seconds,
        warmup=1,
        flops_per_step=20 * 2.0 * 8192**3,
        precision="bf16",
    )
    del a
    torch.cuda.empty_cache()

    try:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=16,
            vocab_size=32000,
            max_position_embeddings=4096,
        )
        llm = LlamaForCausalLM(cfg).to("cuda", bf16).eval()
        params = sum(p.numel() for p in llm.parameters())
        for bsz in (1, 64):
            ids = torch.randint(0, 32000, (bsz, 128), device="cuda")
            new = 256

            def gen(ids=ids, new=new) -> None:
                with torch.no_grad():
                    llm.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

            # decode FLOPs ≈ 2 × params per generated token (attention over ≤384 positions is small)
            name = f"llm_decode_bf16_batch{bsz}"
            res[name] = timed(
                rec,
                name,
                gen,
                seconds,
                warmup=1,
                flops_per_step=2.0 * params * bsz * new,
                precision="bf16",
                extra={"params": params, "batch": bsz, "new_tokens": new},
            )
    except Exception as exc:  # noqa: BLE001
        log(f"decoding skipped: {exc!r}")
        res["llm_decode"] = {"error": repr(exc)}
    return res


def run_extra2(rec: Recorder, seconds: float) -> dict:
    """Small batches (launch-bound steps), a CNN, and kernels that fill only a few SMs."""
    import torch

    res: dict = {}
    bf16 = torch.bfloat16
    d, heads, layers = 1024, 16, 4
    for b in (4, 8):
        fwd, opt, model = transformer(d, heads, layers, "sdpa", bf16)
        step = train_step_fn(fwd, opt, b, 1024, d, bf16)
        name = f"transformer_sdpa_bf16_s1024_batch{b}"
        res[name] = timed(
            rec,
            name,
            step,
            seconds,
            flops_per_step=transformer_flops(b, 1024, d, layers),
            precision="bf16",
            extra={"batch": b, "seq": 1024},
        )
        if b == 4:
            t_step = step_seconds(step, warm=3, n=40)
            stalled = stalled_step(step, t_step * 0.25)
            res["transformer_sdpa_bf16_s1024_batch4_stall"] = timed(
                rec,
                "transformer_sdpa_bf16_s1024_batch4_stall",
                stalled,
                seconds,
                warmup=1,
                flops_per_step=transformer_flops(b, 1024, d, layers),
                precision="bf16",
                extra={"batch": b, "gpu_step_s": round(t_step, 4), "sleep_s": round(t_step * 0.25, 4)},
            )
        del fwd, opt, model, step
        torch.cuda.empty_cache()

    # ResNet-50, channels_last, bf16 autocast, SGD; FLOPs counted by torch.utils.flop_counter
    try:
        import torchvision
        from torch.utils.flop_counter import FlopCounterMode

        net = torchvision.models.resnet50().to("cuda", memory_format=torch.channels_last)
        sgd = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(256, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (256,), device="cuda")

        def cnn(net=net, sgd=sgd, x=x, y=y) -> None:
            with torch.autocast("cuda", dtype=bf16):
                loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            sgd.step()
            sgd.zero_grad(set_to_none=True)

        counter = FlopCounterMode(display=False)
        with counter:
            cnn()
        res["resnet50_channels_last_bf16"] = timed(
            rec,
            "resnet50_channels_last_bf16",
            cnn,
            seconds,
            flops_per_step=float(counter.get_total_flops()),
            precision="bf16",
            extra={"batch": 256, "flops_per_step": counter.get_total_flops()},
        )
        del net, sgd, x, y
        torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001
        log(f"resnet skipped: {exc!r}")
        res["resnet50_channels_last_bf16"] = {"error": repr(exc)}

    # 512³ bf16 products: 16 output tiles, so a few of the 132 SMs have work
    a = torch.randn(512, 512, device="cuda", dtype=bf16)
    bm = torch.randn(512, 512, device="cuda", dtype=bf16)

    def few() -> None:
        for _ in range(50):
            torch.mm(a, bm)

    res["few_sm_small_matmuls"] = timed(
        rec,
        "few_sm_small_matmuls",
        few,
        seconds,
        warmup=5,
        flops_per_step=50 * 2.0 * 512**3,
        precision="bf16",
        extra={"n": 512},
    )
    return res


def start_recording(*agent_args: str) -> tuple[AgentProcess, Recorder]:
    """Start the agent (``--source auto --interval 1s`` and ``agent_args``) and a recorder of GPU 0."""
    import pynvml
    import torch

    torch.cuda.set_device(0)
    pynvml.nvmlInit()
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    agent = AgentProcess("--source", "auto", "--interval", "1s", "--pod-resources-socket", "", *agent_args)
    rec = Recorder(agent, uuid)
    rec.t.start()
    return agent, rec


def finish_recording(rec: Recorder, agent: AgentProcess, name: str, truth: dict) -> None:
    """Stop the recorder and the agent; write $OUT/<name>.csv (the recorder's rows), .truth.json
    (the machine, the peaks, when and ``truth``), .agent.log; then each phase's steady means on
    stdout, for the log."""
    import statistics

    import torch

    rec.stop.set()
    rec.t.join(5)
    agent.stop()
    out = Path(os.environ.get("OUT", "."))
    with open(out / f"{name}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for row in rec.rows:
            w.writerow(row)
    truth = {
        "gpu": torch.cuda.get_device_name(0),
        "driver": sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        "torch": torch.__version__,
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "peak_tflops_dense": PEAK_TFLOPS,
        **truth,
    }
    (out / f"{name}.truth.json").write_text(json.dumps(truth, indent=1))
    (out / f"{name}.agent.log").write_text(agent.output())
    for ph in dict.fromkeys(r["phase"] for r in rec.rows):
        rows = [r for r in rec.rows if r["phase"] == ph][1:]
        if not rows:
            continue
        m = {
            c: round(statistics.fmean(float(r[c]) for r in rows if c in r), 2)
            for c in COLUMNS[2:]
            if any(c in r for r in rows)
        }
        print(ph, len(rows), json.dumps(m), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", choices=["core", "extra", "extra2"], default="core")
    ap.add_argument("--seconds", type=float, default=25.0)
    args = ap.parse_args()
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    agent, rec = start_recording()
    res: dict = {}
    try:
        res = {"core": run_core, "extra": run_extra, "extra2": run_extra2}[args.group](rec, args.seconds)
    finally:
        finish_recording(rec, agent, f"h200-workloads-{args.group}", {"workloads": res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
