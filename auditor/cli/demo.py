"""``gpu-auditor demo``: a small GPU cluster replayed from real H200 traces, audited end to end.

No cluster, no server: the bundled traces (``auditor/data``) are replayed as seventeen jobs of
four teams through the same pipeline as a real audit (replay source → bucketing → store → summary →
verdicts), stored in ``DIR/demo.sqlite`` (never the default store), printed as the verdict table
and written as ``DIR/index.html`` (self-contained) plus ``DIR/summaries.json``; the weekly
team report of the same store (:mod:`auditor.reports`) goes to ``DIR/weekly-report.html``. The
shipped policies run over the jobs, each in mode ``audit`` (:func:`policy_cycle`: recorded,
nothing sent), so that every page of the console has something to show.

The cluster shows every verdict, among them the headline case twice: a single-GPU job spinning a
few thread blocks (100 % "utilization", 3 % SM activity) and a 4-GPU fine-tune whose three ranks
spin in a collective waiting on a straggler rank starved by its host; and issue 28's founding
case: an 8-GPU GPT pretraining at 100 % utilization and 13 % MFU (``low_mfu``, two thirds of its
GPU-hours recoverable at its class's reference MFU) beside its fused twin at 41 %.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from auditor.core.job_summary import JobSummary
from auditor.core.metrics import Metric
from auditor.core.mfu import CLASS_LABEL
from auditor.core.model import GpuId, JobRef, PodRef, Window
from auditor.core.thresholds import Thresholds
from auditor.correlate import StaticResolver
from auditor.traces import Trace, TraceJob, fake_uuid, load_trace, make_gpus

if TYPE_CHECKING:
    from auditor.engine import MfuPlan
    from auditor.policy.decision import Decision
    from auditor.store import Store

CLUSTER = "demo"
H200 = "NVIDIA H200"


@dataclass
class Scenario:
    feeds: list[tuple[Trace, list[TraceJob]]]
    resolver: StaticResolver
    window: Window
    duration: timedelta
    interval: timedelta


def _mig(host: str, index: int, instance: int, profile: str) -> GpuId:
    return GpuId(
        uuid=fake_uuid(host, index),
        instance=str(instance),
        hostname=host,
        index=str(index),
        model=H200,
        mig_profile=profile,
    )


def scenario(now: datetime, *, interval: timedelta = timedelta(seconds=30)) -> Scenario:
    """The demo cluster: (trace, jobs) feeds ending at ``now``, and who owns which pod."""
    cluster = load_trace("h200-demo-cluster")
    micro = load_trace("h200-microbench")
    work = load_trace("h200-workloads")
    h = timedelta(hours=1)
    table: dict[tuple[str, str], JobRef] = {}

    def own(ns: str, pod: str, kind: str, name: str, team: str | None = None, workload: str | None = None) -> PodRef:
        """``workload``: the job's ``gpu-auditor.io/workload-class`` label (its reference MFU)."""
        ref = PodRef(ns, pod, "main")
        table[(ns, pod)] = JobRef(
            cluster=CLUSTER,
            namespace=ns,
            kind=kind,
            name=name,
            uid=fake_uuid(ns, f"{kind}/{name}")[4:],
            team=team or ns,
            labels=((CLASS_LABEL, workload),) if workload else (),
        )
        return ref

    a1, a2, b1 = make_gpus(8, "gpu-node-a1"), make_gpus(8, "gpu-node-a2"), make_gpus(8, "gpu-node-b1")
    c_mig = [_mig("gpu-node-c1", 0, 1, "3g.71gb"), _mig("gpu-node-c1", 0, 2, "1g.18gb")]
    d1 = make_gpus(2, "gpu-node-d1")
    no_sm = frozenset({Metric.SM_ACTIVE, Metric.SM_OCCUPANCY})
    demo_jobs = [
        # vision
        TraceJob(
            own("vision", "resnet50-train-worker-0", "PyTorchJob", "resnet50-train", workload="cnn-training"),
            a1[0:4],
            "resnet50_bf16_training",
            duration=5 * h,
        ),
        TraceJob(
            own("vision", "mlp-baseline", "Pod", "mlp-baseline"),
            a1[4:5],
            "mlp_fp32_training_no_tf32",
            duration=3 * h,
            end_offset=h,
        ),
        # llm
        TraceJob(
            own("llm", "llm-serve-7d9f8-x2k4p", "Deployment", "llm-serve", workload="llm-inference"),
            a2[0:1],
            "llm_batched_inference_bf16",
            duration=6 * h,
        ),
        TraceJob(
            own("llm", "llm-serve-7d9f8-q8zvn", "Deployment", "llm-serve", workload="llm-inference"),
            a2[1:2],
            "llm_batched_inference_bf16",
            duration=6 * h,
        ),
        TraceJob(
            own("llm", "llm-finetune-worker-0", "PyTorchJob", "llm-finetune", workload="llm-finetuning"),
            b1[0:4],
            "kernel_spin_waiting_4_blocks",
            gpu_phases=("kernel_spin_waiting_4_blocks",) * 3 + ("cpu_bound_preprocessing",),
            duration=4 * h,
        ),
        TraceJob(
            own("llm", "kernel-debug", "Job", "kernel-debug"), b1[4:5], "kernel_spin_waiting_4_blocks", duration=2 * h
        ),
        # recsys
        TraceJob(
            own("recsys", "embedding-train-0", "Job", "embedding-train", workload="recsys-training"),
            a2[2:4],
            "embedding_gather",
            duration=2 * h,
        ),
        TraceJob(
            own("recsys", "feature-prep-ab12c", "Job", "feature-prep"),
            a2[4:5],
            "cpu_bound_preprocessing",
            duration=3 * h,
        ),
        TraceJob(
            own("recsys", "legacy-ranker-0", "Job", "legacy-ranker"),
            d1[0:1],
            "resnet50_bf16_training",
            duration=2 * h,
            exclude=no_sm,
        ),
        # research
        TraceJob(
            own("research", "jupyter-alice", "Pod", "jupyter-alice"),
            a2[5:6],
            "notebook_idle_model_loaded",
            duration=6 * h,
        ),
    ]
    micro_jobs = [
        TraceJob(own("research", "spin-test-x7q", "Job", "spin-test"), tuple(a2[6:7]), "one_sm_spin", duration=h),
        TraceJob(
            own("research", "softmax-bench", "Job", "softmax-bench"), tuple(c_mig[0:1]), "naive_softmax", duration=2 * h
        ),
        TraceJob(
            own("research", "jupyter-bob", "Pod", "jupyter-bob"),
            tuple(c_mig[1:2]),
            "bf16_matmul",
            duration=90 * timedelta(minutes=1),
        ),
    ]
    # issue 15's recorded workloads: the classes the verdicts used to get wrong
    work_jobs = [
        TraceJob(
            own("llm", "llm-pretrain-naive-attn-0", "PyTorchJob", "llm-pretrain-naive-attn", workload="llm-training"),
            a1[5:6],
            "transformer_materialized_bf16_s4096",
            duration=3 * h,
        ),
        TraceJob(
            own("vision", "detector-train-0", "Job", "detector-train"),
            a1[6:7],
            "dataloader_stall_busy50",
            duration=4 * h,
        ),
        TraceJob(own("recsys", "shard-loader-0", "Job", "shard-loader"), a1[7:8], "h2d_copy_pinned", duration=h),
    ]
    # issue 28's founding case, recorded: a GPT-style bf16 pretraining in eager PyTorch (attention
    # with a materialised softmax, element-wise ops spelled out; 99 % utilization, MFU 0.14), and
    # its fused twin (SDPA + torch.compile: MFU 0.45, 3.2x the steps per second) on as many GPUs
    gpt = load_trace("h200-mfu-workloads")
    e1, e2 = make_gpus(8, "gpu-node-e1"), make_gpus(8, "gpu-node-e2")
    gpt_jobs = [
        TraceJob(
            own("llm", "gpt-pretrain-worker-0", "PyTorchJob", "gpt-pretrain", workload="llm-training"),
            e1,
            "gpt_unfused_d1536_s2048",
            duration=4 * h,
        ),
        TraceJob(
            own("llm", "gpt-pretrain-fused-worker-0", "PyTorchJob", "gpt-pretrain-fused", workload="llm-training"),
            e2,
            "gpt_fused_d1536_s2048",
            duration=2 * h,
        ),
    ]
    window = Window(now - 6 * h, now)
    return Scenario(
        feeds=[(cluster, demo_jobs), (micro, micro_jobs), (work, work_jobs), (gpt, gpt_jobs)],
        resolver=StaticResolver(table),
        window=window,
        duration=6 * h,
        interval=interval,
    )


def run_demo(
    out_dir: Path,
    *,
    now: datetime | None = None,
    html: bool = True,
    progress=None,
    thresholds: "Thresholds | None" = None,
    mfu: "MfuPlan | None" = None,
    policies: bool = True,
) -> list[JobSummary]:
    """Replay, audit, store, run the shipped policies in mode ``audit`` (:func:`policy_cycle`;
    ``policies=False`` skips them), and write the page; returns the summaries (most waste first).

    ``thresholds`` are the verdict thresholds and ``mfu`` the workload classes (default: the
    built-in ones), so that a tuning can be tried on the bundled traces before it reaches the
    operator."""
    from auditor import compose
    from auditor.engine import run_audit

    say = progress or (lambda _m: None)
    now = (now or compose.clock().now()).replace(microsecond=0)
    out_dir.mkdir(parents=True, exist_ok=True)
    sc = scenario(now)
    source = compose.replay_source(sc.feeds, end=now, duration=sc.duration, interval=sc.interval)
    db = out_dir / "demo.sqlite"
    for stale in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        stale.unlink(missing_ok=True)
    say(f"store: {db}")
    store = compose.store_at(f"sqlite:///{db.resolve()}")
    try:
        result = run_audit(source, sc.resolver, store, sc.window, now=now, progress=say, thresholds=thresholds, mfu=mfu)
        if policies:
            decisions = policy_cycle(store, result.summaries, now)
            say(f"policies, each in mode audit (recorded, nothing sent): {describe_decisions(decisions)}")
    finally:
        store.close()
    docs = [s.to_json() for s in result.summaries]
    (out_dir / "summaries.json").write_text(json.dumps(docs, indent=2) + "\n", encoding="utf-8")
    if html:
        from auditor.render.html import render_html

        say("rendering the HTML page")
        page = render_html(
            result.summaries,
            title="gpu-auditor demo: a small H200 cluster",
            generated_at=now,
            window_start=sc.window.start.isoformat(),
            window_end=sc.window.end.isoformat(),
            source="replayed from real H200 traces",
        )
        (out_dir / "index.html").write_text(page, encoding="utf-8")
        # the weekly team report (auditor.reports) of the week the replayed jobs ran in (the
        # one holding the middle of the replay, so a run just after Monday 00:00 still shows the
        # jobs), read back from the demo's store: what team leads would get on Monday
        from auditor.reports import IsoWeek, generate
        from auditor.reports.html import render_html as render_report
        from auditor.reports.weeks import zone

        say("rendering the weekly team report")
        store = compose.store_at(f"sqlite:///{db.resolve()}")
        try:
            middle = sc.window.start + (sc.window.end - sc.window.start) / 2
            report = generate(store, IsoWeek.containing(middle, zone("UTC")), now=now)
        finally:
            store.close()
        (out_dir / "weekly-report.html").write_text(render_report(report), encoding="utf-8")
    return result.summaries


def policy_cycle(store: "Store", summaries: list[JobSummary], now: datetime) -> list["Decision"]:
    """The shipped policies over the demo's jobs, each in mode ``audit`` (issue 30): violations
    open and every due step is recorded as a dry run, with its actions ``skipped``; nothing is
    written to a job and nothing is sent, whatever the notification variables say. Two cycles, an
    hour apart up to ``now``, so that the ladders reach their alert step: the console's Policy and
    Deliveries pages, ``status`` and ``actions`` then show on the demo's store what the policies
    would do."""
    from auditor.operator_loop.policies import builtin_policy_dir
    from auditor.policy.loader import load_dir
    from auditor.policy.runner import PolicyRunner, RunnerConfig
    from auditor.policy.schema import Mode
    from auditor.settings import Settings

    where = builtin_policy_dir(Settings())
    if where is None:
        return []
    policies = [p.model_copy(update={"spec": p.spec.model_copy(update={"mode": Mode.AUDIT})}) for p in load_dir(where)]
    runner = PolicyRunner(policies, store, None, RunnerConfig(cluster=CLUSTER))
    decisions = []
    for at in (now - timedelta(hours=1), now):
        decisions += runner.run_cycle(summaries, now=at, act=True)
    return decisions


def describe_decisions(decisions: list["Decision"]) -> str:
    """``12 steps on 11 jobs (high-util-low-sm 4, ...)``: what the demo's cycles recorded."""
    due = [d for d in decisions if d.step is not None]
    if not due:
        return "no job breaks a policy"
    per: dict[str, int] = {}
    for d in due:
        per[d.policy] = per.get(d.policy, 0) + 1
    jobs = len({d.job for d in due})
    listed = ", ".join(f"{name} {n}" for name, n in sorted(per.items()))
    return f"{len(due)} step(s) on {jobs} job(s) ({listed})"


def _handle(args: argparse.Namespace) -> int:
    from auditor import compose
    from auditor.render.table import format_table
    from auditor.settings import load_cli_settings

    # only the thresholds and the MFU references are used: the demo has its own store and no cluster
    settings = load_cli_settings(args.config)

    clock = compose.clock()
    t0 = clock.monotonic()
    out = Path(args.out)

    def say(msg: str) -> None:
        print(f"demo: {msg}", file=sys.stderr, flush=True)

    say("replaying the bundled H200 traces as a small cluster of 17 jobs in 4 teams")
    summaries = run_demo(
        out, html=not args.no_html, progress=say, thresholds=settings.thresholds, mfu=compose.mfu_plan(settings)
    )
    sys.stdout.write(format_table(summaries))
    say(
        f"wrote {out / 'demo.sqlite'}, {out / 'summaries.json'}"
        + ("" if args.no_html else f", {out / 'index.html'}, {out / 'weekly-report.html'}")
    )
    say(f"done in {clock.monotonic() - t0:.1f} s")
    say("next, try (the demo's store is not the default one, hence --db):")
    for line in next_commands(out / "demo.sqlite", summaries):
        print(f"  {line}", file=sys.stderr)
    return 0


def next_commands(db: Path, summaries: list[JobSummary]) -> list[str]:
    """The three commands a new admin tries after the demo, as they run from any directory:
    the story behind the job that lost the most GPU-hours, the operator's status, the console.
    The --db is spelled out because every command would otherwise read the default store."""
    url = shlex.quote(f"sqlite:///{db.resolve()}")
    lines = []
    if summaries:
        top = summaries[0]  # most GPU-hours lost first
        lines.append(f"gpu-auditor explain {shlex.quote(f'{top.namespace}/{top.job}')} --db {url}")
    lines.append(f"gpu-auditor status --db {url}")
    lines.append(f"gpu-auditor console --db {url}   # then open the address it prints")
    return lines


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="audit a small replayed H200 cluster: verdict table, SQLite store and an HTML page",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--out", default="demo-out", metavar="DIR", help="output directory (default: ./demo-out)")
    p.add_argument("--no-html", action="store_true", help="skip the HTML page (faster)")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="settings file whose thresholds: and mfu: sections the verdicts use (default: $GPU_AUDITOR_CONFIG, "
        "else /etc/gpu-auditor/settings.yaml when it exists; GPU_AUDITOR_THRESHOLDS__* and GPU_AUDITOR_MFU__* "
        "apply too)",
    )
    p.set_defaults(handler=_handle)
