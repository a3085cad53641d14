"""Each audited job's MFU reference through the engine (issue 28): its workload class, selected by
the job's labels, namespace, team or PriorityClass (the settings' ``mfu:`` classes, else the
shipped ones), or its lineage's best earlier run, read from the store; the summary's
``mfu_reference``, ``mfu_class`` and ``recoverable_gpu_hours`` follow, and so do the store's
columns. Replayed real H200 traces into SQLite here; against the test bed's apiserver,
Prometheus and PostgreSQL at the end."""

from __future__ import annotations

import json
import math
import re
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from auditor import compose, traces
from auditor.core.lineage import LINEAGE_LABEL
from auditor.core.mfu import CLASS_LABEL, LINEAGE_BEST, WorkloadClass
from auditor.core.model import JobRef, PodRef, Window
from auditor.correlate import NoKubeResolver, StaticResolver
from auditor.engine import MfuPlan, run_audit
from auditor.kube.jobview import OwnerRef, PodInfo, attribute, pod_info
from auditor.settings import load_settings
from auditor.sources.replay import ReplaySource
from auditor.store import Store

END = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)
WINDOW = Window(END - 3 * H, END)
FUSED, UNFUSED = "transformer_sdpa_bf16_s4096", "transformer_materialized_bf16_s4096"


def _ref(name: str, ns: str = "llm", *, klass: str | None = None, lineage: str | None = None, **kw) -> JobRef:
    labels = []
    if klass:
        labels.append((CLASS_LABEL, klass))
    if lineage:
        labels.append((LINEAGE_LABEL, lineage))
    kw.setdefault("team", ns)
    return JobRef("c1", ns, "Job", name, uid=f"uid-{name}", labels=tuple(sorted(labels)), **kw)


def _source(jobs: list[tuple[JobRef, str, timedelta]]) -> tuple[ReplaySource, StaticResolver]:
    """Each job one pod on its own GPU replaying ``phase`` for the hour ending ``offset`` before END."""
    work = traces.load_trace("h200-workloads")
    table, tjs = {}, []
    for i, (job, phase, offset) in enumerate(jobs):
        pod = PodRef(job.namespace, f"{job.name}-0", "main")
        table[(pod.namespace, pod.pod)] = job
        tjs.append(traces.TraceJob(pod, traces.make_gpus(1, f"node{i}"), phase, duration=H, end_offset=offset))
    return ReplaySource([(work, tjs)], end=END, duration=3 * H), StaticResolver(table)


def _by_job(result) -> dict[str, dict]:
    return {s.job: s.to_json() for s in result.summaries}


def test_the_class_label_selects_the_shipped_reference_and_the_gap_follows(tmp_path) -> None:
    jobs = [
        (_ref("gpt-naive", klass="llm-training"), UNFUSED, timedelta(0)),
        (_ref("gpt-fused", klass="llm-training"), FUSED, timedelta(0)),
        (_ref("resnet", "vision", klass="cnn-training"), "resnet50_channels_last_bf16", timedelta(0)),
        (_ref("server", klass="llm-inference"), "llm_decode_bf16_batch64", timedelta(0)),
        (_ref("unlabelled"), UNFUSED, timedelta(0)),
    ]
    source, resolver = _source(jobs)
    with Store.open(f"sqlite:///{tmp_path}/s.db") as store:
        got = _by_job(run_audit(source, resolver, store, WINDOW, now=END))
        stored = {d["job"]: d for d in store.summaries()}
    naive = got["Job/gpt-naive"]
    assert (naive["mfu_class"], naive["mfu_reference"]) == ("llm-training", 0.4)
    assert naive["mfu_estimate"] == pytest.approx(0.08, abs=0.02)
    assert naive["recoverable_gpu_hours"] == pytest.approx(
        naive["gpu_hours"] * (1 - naive["mfu_estimate"] / 0.4), abs=1e-4
    )
    assert naive["recoverable_gpu_hours"] > 0.7 * naive["gpu_hours"]
    # the fused twin reaches its class's reference: nothing to recover
    fused = got["Job/gpt-fused"]
    assert fused["mfu_class"] == "llm-training" and fused["recoverable_gpu_hours"] == pytest.approx(0, abs=0.05)
    # classes without a reference, and a job without a class, are never charged
    for name in ("Job/resnet", "Job/server", "Job/unlabelled"):
        assert (got[name]["mfu_reference"], got[name]["mfu_class"], got[name]["recoverable_gpu_hours"]) == (
            None,
            None,
            None,
        ), name
    assert got["Job/unlabelled"]["mfu_estimate"] == pytest.approx(naive["mfu_estimate"], abs=0.01)
    assert stored == got  # the store holds what the engine computed


def test_settings_classes_select_by_namespace_team_and_priority_class(tmp_path) -> None:
    f = tmp_path / "settings.yaml"
    f.write_text(
        "mfu:\n  classes:\n"
        "    - {name: urgent, reference_mfu: 0.45, priority_classes: [high-*]}\n"
        "    - {name: research-llm, reference_mfu: 0.35, teams: [research]}\n"
        "    - {name: llm-ns, reference_mfu: 0.38, namespaces: [llm*]}\n"
    )
    plan = compose.mfu_plan(load_settings(f, environ={}))
    jobs = [
        (_ref("a", "llm-prod"), UNFUSED, timedelta(0)),
        (_ref("b", "shared", team="research"), UNFUSED, timedelta(0)),
        (_ref("c", "llm-prod", priority_class="high-prio"), UNFUSED, timedelta(0)),
        (_ref("d", "vision", klass="llm-training"), UNFUSED, timedelta(0)),  # the shipped classes are replaced
    ]
    source, resolver = _source(jobs)
    got = _by_job(run_audit(source, resolver, None, WINDOW, now=END, mfu=plan))
    assert {k: (v["mfu_class"], v["mfu_reference"]) for k, v in got.items()} == {
        "Job/a": ("llm-ns", 0.38),
        "Job/b": ("research-llm", 0.35),
        "Job/c": ("urgent", 0.45),
        "Job/d": (None, None),
    }


def test_no_kube_jobs_select_by_namespace() -> None:
    """``--no-kube``: a job is ``Pod/<name>`` with its namespace as its team; a class by namespace
    (or team) still applies."""
    work = traces.load_trace("h200-workloads")
    tj = traces.TraceJob(PodRef("llm-train", "gpt-0"), traces.make_gpus(1, "n1"), UNFUSED, duration=H)
    source = ReplaySource([(work, [tj])], end=END, duration=H)
    plan = MfuPlan(classes=(WorkloadClass("by-team", 0.4, teams=("llm-*",)),))
    (s,) = run_audit(source, NoKubeResolver("c1"), None, Window(END - H, END), now=END, mfu=plan).summaries
    assert (s.job, s.team, s.mfu_class, s.mfu_reference) == ("Pod/gpt-0", "llm-train", "by-team", 0.4)


def test_the_lineage_best_earlier_run_is_the_reference(tmp_path) -> None:
    """The fused run of a lineage (two submissions of ``gpt-<generated>``), then an unfused one:
    the unfused run is measured against the fused one's MFU (read from the store), the fused one
    against nothing (no earlier run); a serving class takes no lineage reference;
    ``lineage_best: false`` turns it off."""
    jobs = [
        (_ref("gpt-7f9c2"), FUSED, 2 * H),
        (_ref("gpt-b4x2z"), UNFUSED, timedelta(0)),
        (_ref("serve-7f9c2", klass="llm-inference"), "llm_decode_bf16_batch64", 2 * H),
        (_ref("serve-b4x2z", klass="llm-inference"), "llm_decode_bf16_batch1", timedelta(0)),
    ]
    source, resolver = _source(jobs)
    with Store.open(f"sqlite:///{tmp_path}/s.db") as store:
        first = _by_job(run_audit(source, resolver, store, WINDOW, now=END))
        assert first["Job/gpt-b4x2z"]["mfu_class"] is None  # no run of the lineage was recorded yet
        again = _by_job(run_audit(source, resolver, store, WINDOW, now=END))
        off = _by_job(run_audit(source, resolver, store, WINDOW, now=END, mfu=MfuPlan(lineage_best=False)))
    v1, v2 = again["Job/gpt-7f9c2"], again["Job/gpt-b4x2z"]
    assert v1["mfu_class"] is None and v1["mfu_reference"] is None  # v2 ran after it
    assert v2["mfu_class"] == LINEAGE_BEST and v2["mfu_reference"] == pytest.approx(v1["mfu_estimate"], abs=1e-6)
    assert v2["recoverable_gpu_hours"] == pytest.approx(
        v2["gpu_hours"] * (1 - v2["mfu_estimate"] / v2["mfu_reference"]), abs=1e-4
    )
    assert again["Job/serve-b4x2z"]["mfu_class"] is None
    assert off["Job/gpt-b4x2z"]["mfu_class"] is None


def test_a_lineage_label_joins_runs_of_other_names(tmp_path) -> None:
    """Runs recorded under the label ``gpu-auditor.io/lineage`` (as the operator's cycle records
    them, from ``kube.lineage``) are the lineage of a job carrying the label."""
    v1, v2 = _ref("pretrain-a", lineage="gpt"), _ref("pretrain-b", lineage="gpt")
    with Store.open(f"sqlite:///{tmp_path}/s.db") as store:
        job_id = store.upsert_job(v1, END - 3 * H, END - 2 * H)
        store.save_summary(
            job_id,
            {
                "job": v1.job,
                "verdict": "healthy",
                "start": "2026-11-30T09:00:00Z",
                "end": "2026-11-30T10:00:00Z",
                "mfu_estimate": 0.46,
                "kube": {"lineage": "gpt"},
            },
        )
        source, resolver = _source([(v2, UNFUSED, timedelta(0))])
        (got,) = run_audit(source, resolver, store, WINDOW, now=END).summaries
    assert (got.mfu_class, got.mfu_reference) == (LINEAGE_BEST, 0.46)


def test_a_class_reference_above_the_lineage_best_wins(tmp_path) -> None:
    jobs = [
        (_ref("gpt-7f9c2", klass="llm-training"), UNFUSED, 2 * H),
        (_ref("gpt-b4x2z", klass="llm-training"), UNFUSED, timedelta(0)),
    ]
    source, resolver = _source(jobs)
    with Store.open(f"sqlite:///{tmp_path}/s.db") as store:
        run_audit(source, resolver, store, WINDOW, now=END)
        got = _by_job(run_audit(source, resolver, store, WINDOW, now=END))
    assert (got["Job/gpt-b4x2z"]["mfu_class"], got["Job/gpt-b4x2z"]["mfu_reference"]) == ("llm-training", 0.4)


def _pod(name: str, labels: dict, priority: str | None = None, owner: OwnerRef | None = None) -> PodInfo:
    obj = {
        "metadata": {"namespace": "ml", "name": name, "uid": f"u-{name}", "labels": labels},
        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"},
    }
    if priority:
        obj["spec"]["priorityClassName"] = priority
    info = pod_info(obj)
    assert info is not None
    info.owner = owner
    return info


def test_the_resolver_gives_a_job_its_labels_and_priority_class() -> None:
    """The job's labels are its pods' under its top owner's own (a pod template's label is the
    job's too); its PriorityClass is its pods' ``priorityClassName``, else Kueue's label."""
    from auditor.kube.jobview import OwnerMeta

    owner = OwnerRef("batch/v1", "Job", "train", "u-job")
    meta = OwnerMeta(
        "batch/v1", "Job", "train", "u-job", {"team": "llm", "kueue.x-k8s.io/priority-class": "p"}, None, 0
    )
    pods = [
        _pod("train-1", {CLASS_LABEL: "llm-training", "team": "pods"}, priority="high-prio", owner=owner),
        _pod("train-0", {"app": "gpt"}, owner=owner),
        _pod("solo", {}, None),
    ]
    view = attribute(
        pods, lambda _ns, ref: meta, cluster="c1", team_sources=["jobLabel:team"], ns_labels={}, wl_index={}, lqs={}
    )
    job = view["c1/ml/Job/train"].ref
    assert job.labels == (
        ("app", "gpt"),
        (CLASS_LABEL, "llm-training"),
        ("kueue.x-k8s.io/priority-class", "p"),
        ("team", "llm"),
    )
    assert job.priority_class == "high-prio"
    assert view["c1/ml/Pod/solo"].ref.priority_class is None
    meta.labels = {"kueue.x-k8s.io/priority-class": "batch-low"}
    pods[0].priority_class = None
    job = attribute(pods, lambda _ns, ref: meta, cluster="c1", team_sources=[], ns_labels={}, wl_index={}, lqs={})
    assert job["c1/ml/Job/train"].ref.priority_class == "batch-low"


# -- the test bed: the apiserver's labels, Prometheus, PostgreSQL --------------------------------------

INTERVAL = timedelta(seconds=15)


@pytest.mark.testbed
def test_class_labels_through_the_api_and_prometheus_into_postgresql(
    testbed, kube_admin, namespace, prometheus, postgres_url, tmp_path, capsys
) -> None:
    """Two Jobs on the bed's apiserver replaying the unfused transformer: one labelled
    ``llm-training`` (its pod template's label), one not; audited through the Kubernetes API
    and Prometheus into PostgreSQL (``audit --kubeconfig``). Then ``audit --no-kube`` with a
    class by namespace from the settings file."""
    from kubeobjects import batch_job, create_pod

    from auditor.cli.main import main

    case = f"mf{uuid.uuid4().hex[:8]}"
    trace = traces.load_trace("h200-workloads")
    cycle = len(trace.steady(UNFUSED)) * INTERVAL
    duration = cycle * math.ceil(timedelta(minutes=30) / cycle)
    end = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=1)  # backfill wants the past
    tjs = []
    for i, (name, labels) in enumerate([("gpt", {CLASS_LABEL: "llm-training"}), ("plain", {})]):
        job = batch_job(kube_admin, namespace, name, labels={"team": "llm"})
        pod = f"{name}-0-abcde"
        node = f"{case}-node{i}"
        create_pod(kube_admin, namespace, pod, gpus=1, owner=job, labels=labels, node=node, started=end - duration)
        tjs.append(
            traces.TraceJob(PodRef(namespace, pod, "main"), traces.make_gpus(1, node), UNFUSED, duration=duration)
        )
    text = traces.trace_to_openmetrics(trace, tjs, end=end, duration=duration, interval=INTERVAL)
    prometheus.backfill(re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", rf'\1{{case="{case}",', text, flags=re.M))
    common = [
        "audit",
        "--prometheus",
        prometheus.url,
        "--match",
        f"case={case}",
        "--start",
        (end - duration - timedelta(minutes=5)).isoformat(),
        "--end",
        end.isoformat(),
        "--db",
        postgres_url,
        "--output",
        "json",
    ]
    assert main([*common, "--kubeconfig", testbed.kubeconfig]) == 0, capsys.readouterr().err
    got = {d["job"]: d for d in json.loads(capsys.readouterr().out)}
    gpt, plain = got["Job/gpt"], got["Job/plain"]
    assert (gpt["mfu_class"], gpt["mfu_reference"]) == ("llm-training", 0.4)
    assert gpt["mfu_estimate"] == pytest.approx(0.08, abs=0.02)
    assert gpt["recoverable_gpu_hours"] == pytest.approx(gpt["gpu_hours"] * (1 - gpt["mfu_estimate"] / 0.4), abs=1e-3)
    assert (plain["mfu_class"], plain["recoverable_gpu_hours"]) == (None, None)
    with Store.open(postgres_url) as store:
        stored = {d["job"]: d for d in store.summaries(namespace=namespace)}
        assert stored["Job/gpt"]["recoverable_gpu_hours"] == gpt["recoverable_gpu_hours"]
        found = store.find_job(namespace, "Job", "gpt")
        assert found is not None

    settings = tmp_path / "settings.yaml"
    settings.write_text(f"mfu:\n  classes:\n    - {{name: bed-llm, reference_mfu: 0.35, namespaces: [{namespace}]}}\n")
    db = f"sqlite:///{tmp_path}/nokube.db"
    no_kube = [*common[:-4], "--db", db, "--output", "json", "--no-kube"]
    assert main([*no_kube, "--config", str(settings)]) == 0, capsys.readouterr().err
    got = {d["job"]: d for d in json.loads(capsys.readouterr().out)}
    assert {(d["mfu_class"], d["mfu_reference"]) for d in got.values()} == {("bed-llm", 0.35)}
    assert set(got) == {"Pod/gpt-0-abcde", "Pod/plain-0-abcde"}


def test_a_long_lived_plan_reads_a_jobs_lineage_best_once_per_ttl() -> None:
    """The operator's plan lives across cycles: a job's lineage best is read at its first
    cycle and again only when ``lineage_ttl`` of audit time has passed."""
    calls: list[list[str]] = []
    best = {"c1/llm/Job/a": 0.3}

    def lookup(jobs):
        calls.append([j.key for j in jobs])
        return {j.key: best[j.key] for j in jobs if j.key in best}

    plan = MfuPlan()
    a, b = _ref("a"), _ref("b")
    assert plan.lineage_bests(lookup, [a, b], END) == {a.key: 0.3}
    best[a.key] = 0.45
    assert plan.lineage_bests(lookup, [a, b], END + timedelta(minutes=59)) == {a.key: 0.3}
    assert plan.lineage_bests(lookup, [a, b, _ref("c")], END + timedelta(minutes=59)) == {a.key: 0.3}
    assert plan.lineage_bests(lookup, [a], END + timedelta(minutes=61)) == {a.key: 0.45}
    assert plan.lineage_bests(lookup, [a], END - timedelta(hours=5)) == {a.key: 0.45}  # an older audit reads again
    assert calls == [[a.key, b.key], ["c1/llm/Job/c"], [a.key], [a.key]]


@pytest.mark.testbed
def test_the_operator_cycle_measures_a_run_against_its_lineage_label(kube_admin, namespace, tmp_path) -> None:
    """Through the operator's cycles on the bed's apiserver: two Jobs of different names share the
    label ``gpu-auditor.io/lineage: gpt`` (on the pod template only). The fused run, audited
    first, is recorded under the label (``kube.lineage``); the unfused run submitted after it is
    measured against it (``lineage-best``) at its first cycle, the fused one against nothing."""
    from kubeobjects import batch_job, create_pod
    from operator_settings import operator_settings

    from auditor.operator_loop import Operator

    now = datetime.now(timezone.utc).replace(microsecond=0)
    work = traces.load_trace("h200-workloads")
    settings = operator_settings(tmp_path, cluster=f"c-{namespace}", max_lookback="4h")
    tjs: list[traces.TraceJob] = []
    got: dict[str, dict] = {}
    for i, (name, phase, offset) in enumerate([("pretrain-a", FUSED, 2 * H), ("pretrain-b", UNFUSED, timedelta(0))]):
        job = batch_job(kube_admin, namespace, name, labels={"team": "llm"})
        pod, node = f"{name}-0-abcde", f"{namespace}-node{i}"
        labels = {LINEAGE_LABEL: "gpt", "team": "llm"}
        started = now - offset - H
        create_pod(kube_admin, namespace, pod, gpus=1, owner=job, labels=labels, node=node, started=started)
        gpus = traces.make_gpus(1, node)
        tjs.append(traces.TraceJob(PodRef(namespace, pod, "main"), gpus, phase, duration=H, end_offset=offset))
        source = ReplaySource([(work, list(tjs))], end=now, duration=3 * H)
        with Store.open(settings.store.url) as store:  # an operator per job: the second one is new to it
            result = Operator(settings, store=store, source=source, api=kube_admin).run_once()
        got.update({s.job: s.to_json() for s in result.summaries if s.namespace == namespace})
    a, b = got["Job/pretrain-a"], got["Job/pretrain-b"]
    assert a["mfu_class"] is None and a["mfu_estimate"] > 0.35
    assert (b["mfu_class"], b["mfu_reference"]) == (LINEAGE_BEST, pytest.approx(a["mfu_estimate"], abs=1e-6))
    assert b["recoverable_gpu_hours"] > 0.7 * b["gpu_hours"] > 0


def test_a_job_re_summarized_after_losing_gpu_time_keeps_its_reference(tmp_path) -> None:
    """When a later audit names some of a job's pods another job, the job is re-summarized from
    what it has left (engine ``_hand_over``): its stored job row has no labels to select a class
    by, so the reference its last summary was computed with is kept."""
    work = traces.load_trace("h200-workloads")
    a = _ref("gpt", klass="llm-training")
    pods = [PodRef("llm", f"gpt-{i}", "main") for i in range(2)]
    tjs = [traces.TraceJob(p, traces.make_gpus(1, f"n{i}"), UNFUSED, duration=H) for i, p in enumerate(pods)]
    source = ReplaySource([(work, tjs)], end=END, duration=H)
    window = Window(END - H, END)
    with Store.open(f"sqlite:///{tmp_path}/s.db") as store:
        run_audit(source, StaticResolver({("llm", p.pod): a for p in pods}), store, window, now=END)
        run_audit(source, StaticResolver({("llm", "gpt-1"): _ref("other")}), store, window, now=END)
        kept = {d["job"]: d for d in store.summaries()}
    assert kept["Job/gpt"]["gpu_hours"] == pytest.approx(1.0, abs=0.01)  # one pod left
    assert (kept["Job/gpt"]["mfu_class"], kept["Job/gpt"]["mfu_reference"]) == ("llm-training", 0.4)
    assert kept["Job/gpt"]["recoverable_gpu_hours"] == pytest.approx(
        1.0 * (1 - kept["Job/gpt"]["mfu_estimate"] / 0.4), abs=0.01
    )
    assert kept["Job/other"]["mfu_class"] is None
