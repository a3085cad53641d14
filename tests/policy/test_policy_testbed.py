"""Done-when tests of issue 5 against the test bed: real apiserver with the real Kueue controller
(its Workload of the queued job, its priority class), real local HTTP receivers for Slack and the
webhook, a real store."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import yaml
from kubernetes import client as k8s
from kueue_objects import delete_cluster_object, job_workload, workload_priority_class
from policy_receivers import Receiver
from spin_backfill import backfill_spin

from auditor.actions import KubeActions
from auditor.cli.main import main
from auditor.core.identity import JobKey
from auditor.core.job_summary import JobSummary
from auditor.core.metrics import Metric
from auditor.core.model import Bucket, GpuId, JobRef, PodRef
from auditor.notify import verify_signature
from auditor.notify.http import RetryPolicy
from auditor.policy.loader import PolicyRegistry, parse_policies
from auditor.policy.runner import PolicyRunner, RequeueSettings, Route, RunnerConfig
from auditor.store import Store
from auditor.store.decisions import DecisionStore

pytestmark = pytest.mark.testbed

T0 = datetime.now(timezone.utc).replace(microsecond=0)
SECRET = "s3cret"
POLICY = """
apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: low-sm}
spec:
  mode: enforce
  verdicts: [low_sm_efficiency]
  conditions:
    - {field: gpu_util, op: ">=", value: 0.8}
    - {field: sm_active, op: "<=", value: 0.3}
  sustained:
    for: 30m
    warmup: 10m
    conditions:
      - {field: gpu_util, op: ">=", value: 0.8}
      - {field: sm_active, op: "<=", value: 0.3}
  escalation:
    - actions: [annotate, event]
    - actions: [notify]
      cooldown: 1m
    - actions: [requeue]
      cooldown: 1m
  requeue: {backoff: 10m, maxPerJob: 1, lowerPriorityBy: 10}
  advice: fuse kernels
"""
FAST = RetryPolicy(attempts=3, base=0.01, cap=0.05, max_wait=2, timeout=5)


def _buckets(ns: str, pod: str, util: float, sm: float, minutes: int = 60) -> list[Bucket]:
    p, g = PodRef(ns, pod), GpuId(f"GPU-{pod}", index="0", model="NVIDIA H200")
    out = []
    end = T0.replace(second=0) - timedelta(minutes=T0.minute % 5)
    for i in range(minutes // 5):
        s = end - timedelta(minutes=5 * (i + 1))
        for m, v in ((Metric.GPU_UTIL, util), (Metric.SM_ACTIVE, sm)):
            out.append(Bucket(p, g, m, s, s + timedelta(minutes=5), v * 20, 20, v, v))
    return out


def _job(
    kube_admin,
    ns: str,
    name: str,
    annotations: dict | None = None,
    kueue: bool = False,
    priority_class: str | None = None,
) -> dict:
    batch = k8s.BatchV1Api(kube_admin)
    labels = {"kueue.x-k8s.io/queue-name": "team-a"} if kueue else {}
    if priority_class:
        labels["kueue.x-k8s.io/priority-class"] = priority_class
    job = batch.create_namespaced_job(
        ns,
        k8s.V1Job(
            metadata=k8s.V1ObjectMeta(name=name, annotations=annotations or {}, labels=labels),
            spec=k8s.V1JobSpec(
                suspend=kueue,
                template=k8s.V1PodTemplateSpec(
                    spec=k8s.V1PodSpec(restart_policy="Never", containers=[k8s.V1Container(name="c", image="busybox")])
                ),
            ),
        ),
    )
    pod = k8s.CoreV1Api(kube_admin).create_namespaced_pod(
        ns,
        k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=f"{name}-0", labels={"batch.kubernetes.io/job-name": name}),
            spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="busybox")]),
        ),
    )
    return {"uid": job.metadata.uid, "pod": pod.metadata.name}


def _workload(kube_admin, ns: str, job_name: str) -> str:
    """Kueue's Workload of the queued job (its priority from the job's WorkloadPriorityClass)."""
    from auditor.kube.client import call_json, resource_path

    job = call_json(kube_admin, resource_path("batch/v1", "jobs", ns, job_name))
    return job_workload(kube_admin, ns, job)["metadata"]["name"]


@pytest.fixture
def priority_class(kube_admin):
    name = f"train-{uuid.uuid4().hex[:8]}"
    workload_priority_class(kube_admin, name, 100)
    yield name
    delete_cluster_object(kube_admin, "workloadpriorityclasses", name)


def _summary(
    ns: str, name: str, pod: str, uid: str, verdict: str, util: float, sm: float, team: str = "ml", **more: object
) -> JobSummary:
    return JobSummary.example(
        **{
            "cluster": "default",
            "namespace": ns,
            "job": f"Job/{name}",
            "uid": uid,
            "team": team,
            "queue": "team-a",
            "gpu_model": "NVIDIA H200",
            "gpus": 1,
            "pods": [pod],
            "verdict": verdict,
            "gpu_util": util,
            "sm_active": sm,
            "coverage": 0.99,
            "gpu_hours": 1.0,
            "waste_gpu_hours": 1.0 - sm,
            **more,
        }
    )


def _store_job(store: Store, ns: str, name: str, uid: str, pod: str, util: float, sm: float) -> None:
    jid = store.upsert_job(JobRef("default", ns, "Job", name, uid, "ml", "team-a"), T0 - timedelta(hours=1), T0)
    store.replace_buckets(jid, _buckets(ns, pod, util, sm))


def _events(kube_admin, ns: str, name: str) -> list:
    """Events about ``name``, read untyped: Kueue records core/v1 Events (no ``eventTime``), which
    the typed events.k8s.io model of the client refuses to parse."""
    from types import SimpleNamespace

    from auditor.kube.client import call_json, resource_path

    items = call_json(kube_admin, resource_path("events.k8s.io/v1", "events", ns)).get("items") or []
    return [
        SimpleNamespace(reason=e.get("reason"), type=e.get("type"), regarding=e["regarding"])
        for e in items
        if (e.get("regarding") or {}).get("name") == name
    ]


def _annotations(kube_admin, ns: str, name: str) -> dict:
    return k8s.BatchV1Api(kube_admin).read_namespaced_job(name, ns).metadata.annotations or {}


def _wl(kube_admin, ns: str, name: str) -> dict:
    return k8s.CustomObjectsApi(kube_admin).get_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", ns, "workloads", name
    )


@pytest.fixture
def receivers():
    slack, hook = Receiver(), Receiver()
    yield slack, hook
    slack.close()
    hook.close()


def test_low_sm_job_escalates_once_and_requeues_through_kueue(
    kube_admin, namespace, tmp_path, receivers, priority_class
):
    slack, hook = receivers
    ns = namespace
    bad = _job(kube_admin, ns, "bad", kueue=True, priority_class=priority_class)
    wl = _workload(kube_admin, ns, "bad")
    assert _wl(kube_admin, ns, wl)["spec"]["priority"] == 100  # from the WorkloadPriorityClass
    good = _job(kube_admin, ns, "good")
    exempt = _job(kube_admin, ns, "exempt", annotations={"gpu-auditor.io/exempt": "true"})
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    for name, info, (u, s) in (("bad", bad, (0.97, 0.1)), ("good", good, (0.97, 0.8)), ("exempt", exempt, (0.97, 0.1))):
        _store_job(store, ns, name, info["uid"], info["pod"], u, s)
    summaries = [
        _summary(ns, "bad", bad["pod"], bad["uid"], "low_sm_efficiency", 0.97, 0.1),
        _summary(ns, "good", good["pod"], good["uid"], "healthy", 0.97, 0.8),
        _summary(ns, "exempt", exempt["pod"], exempt["uid"], "low_sm_efficiency", 0.97, 0.1),
    ]
    config = RunnerConfig(
        routes={"ml": Route(slack_url=slack.url, webhook_url=hook.url, webhook_secret=SECRET)},
        requeue=RequeueSettings(enabled=True, namespaces=frozenset({ns})),
        retry=FAST,
    )
    runner = PolicyRunner(parse_policies(POLICY, "p.yaml"), store, KubeActions(kube_admin, "test"), config)
    try:
        for minute in range(0, 8):  # several cycles, one per minute
            runner.run_cycle(summaries, now=T0 + timedelta(minutes=minute), act=True)
        ann = _annotations(kube_admin, ns, "bad")
        assert ann["gpu-auditor.io/verdict"] == "low_sm_efficiency"
        assert ann["gpu-auditor.io/policy"] == "low-sm"
        assert "gpu-auditor.io/requeued-at" in ann
        pod_ann = k8s.CoreV1Api(kube_admin).read_namespaced_pod(bad["pod"], ns).metadata.annotations
        assert pod_ann["gpu-auditor.io/verdict"] == "low_sm_efficiency"
        warnings = [e for e in _events(kube_admin, ns, "bad") if e.reason == "GpuPolicyViolation"]
        assert len(warnings) == 1 and warnings[0].type == "Warning"
        assert len(slack.accepted) == 1 and len(hook.accepted) == 1  # exactly one alert over 8 cycles
        w = _wl(kube_admin, ns, wl)
        assert w["spec"]["active"] is False and w["spec"]["priority"] == 100
        assert w["metadata"]["annotations"]["kueue.x-k8s.io/priority-boost"] == "-10"
        # our backoff: not before 10 minutes, then back to active
        runner.run_cycle(summaries, now=T0 + timedelta(minutes=9), act=True)
        assert _wl(kube_admin, ns, wl)["spec"]["active"] is False
        runner.run_cycle(summaries, now=T0 + timedelta(minutes=13), act=True)
        assert _wl(kube_admin, ns, wl)["spec"]["active"] is True
        runner.run_cycle(summaries, now=T0 + timedelta(minutes=30), act=True)
        assert len(slack.accepted) == 1
        # healthy and exempt jobs untouched
        for name in ("good", "exempt"):
            assert not any(k.startswith("gpu-auditor.io/verdict") for k in _annotations(kube_admin, ns, name))
            assert _events(kube_admin, ns, name) == []
        repo = DecisionStore(store)
        assert [d["step"] for d in repo.decisions(job=JobKey("default", ns, "Job", "bad"))] == [0, 1, 2]
        assert repo.decisions(job=JobKey("default", ns, "Job", "exempt")) == []
    finally:
        store.close()


def test_snooze_annotation_holds_every_action(kube_admin, namespace, tmp_path, receivers):
    slack, _ = receivers
    ns = namespace
    until = (T0 + timedelta(hours=2)).isoformat().replace("+00:00", "Z")
    bad = _job(kube_admin, ns, "bad", annotations={"gpu-auditor.io/snooze-until": until})
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    _store_job(store, ns, "bad", bad["uid"], bad["pod"], 0.97, 0.1)
    s = _summary(ns, "bad", bad["pod"], bad["uid"], "low_sm_efficiency", 0.97, 0.1)
    runner = PolicyRunner(
        parse_policies(POLICY, "p.yaml"),
        store,
        KubeActions(kube_admin),
        RunnerConfig(default_route=Route(slack_url=slack.url), retry=FAST),
    )
    try:
        ds = [runner.run_cycle([s], now=T0 + timedelta(minutes=m), act=True) for m in range(3)]
        assert all(d[0].blocked and d[0].blocked.startswith("snoozed") for d in ds)
        assert "gpu-auditor.io/verdict" not in _annotations(kube_admin, ns, "bad")
        assert slack.requests == [] and _events(kube_admin, ns, "bad") == []
        runner.run_cycle([s], now=T0 + timedelta(hours=3), act=True)  # snooze over: the ladder starts
        assert _annotations(kube_admin, ns, "bad")["gpu-auditor.io/verdict"] == "low_sm_efficiency"
    finally:
        store.close()


def test_restart_between_steps_neither_repeats_nor_skips(kube_admin, namespace, postgres_url, receivers):
    slack, hook = receivers
    ns = namespace
    bad = _job(kube_admin, ns, "bad")
    s = _summary(ns, "bad", bad["pod"], bad["uid"], "low_sm_efficiency", 0.97, 0.1)
    config = RunnerConfig(
        default_route=Route(slack_url=slack.url, webhook_url=hook.url, webhook_secret=SECRET), retry=FAST
    )
    policies = parse_policies(POLICY.replace("mode: enforce", "mode: warn"), "p.yaml")

    store = Store.open(postgres_url)
    _store_job(store, ns, "bad", bad["uid"], bad["pod"], 0.97, 0.1)
    PolicyRunner(policies, store, KubeActions(kube_admin), config).run_cycle([s], now=T0, act=True)
    store.close()  # "restart": a new process, new store connection, new runner
    for _attempt in range(2):  # a second leader replaying the same cycle changes nothing
        store = Store.open(postgres_url)
        runner = PolicyRunner(policies, store, KubeActions(kube_admin), config)
        runner.run_cycle([s], now=T0 + timedelta(seconds=30), act=True)  # cooldown 1m: step 1 not yet due
        runner.run_cycle([s], now=T0 + timedelta(minutes=2), act=True)
        store.close()
    store = Store.open(postgres_url)
    assert [d["step"] for d in DecisionStore(store).decisions(job=JobKey("default", ns, "Job", "bad"))] == [0, 1]
    PolicyRunner(policies, store, KubeActions(kube_admin), config).run_cycle(
        [s], now=T0 + timedelta(minutes=4), act=True
    )
    try:
        steps = [d["step"] for d in DecisionStore(store).decisions(job=JobKey("default", ns, "Job", "bad"))]
        assert steps == [0, 1, 2]  # annotate+event, notify, requeue (skipped: mode warn); each once
        acts = {a.action: a.state for a in DecisionStore(store).actions(job=JobKey("default", ns, "Job", "bad"))}
        assert acts == {"annotate": "done", "event": "done", "notify": "done", "requeue": "skipped"}
        assert len(slack.accepted) == 1 and len(hook.accepted) == 1
        assert len([e for e in _events(kube_admin, ns, "bad") if e.reason == "GpuPolicyViolation"]) == 1
    finally:
        store.close()


def test_webhook_500_then_200_one_delivery_valid_signature(kube_admin, namespace, tmp_path):
    hook = Receiver(script=[(500, {})])
    ns = namespace
    bad = _job(kube_admin, ns, "bad")
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    _store_job(store, ns, "bad", bad["uid"], bad["pod"], 0.97, 0.1)
    s = _summary(ns, "bad", bad["pod"], bad["uid"], "low_sm_efficiency", 0.97, 0.1)
    config = RunnerConfig(default_route=Route(webhook_url=hook.url, webhook_secret=SECRET), retry=FAST)
    runner = PolicyRunner(
        parse_policies(POLICY.replace("mode: enforce", "mode: warn"), "p.yaml"), store, KubeActions(kube_admin), config
    )
    try:
        for m in range(5):
            runner.run_cycle([s], now=T0 + timedelta(minutes=m), act=True)
        assert hook.statuses == [500, 200]
        assert len(hook.accepted) == 1
        got = hook.accepted[0]
        assert verify_signature(SECRET, got.body, got.headers["X-Gpu-Auditor-Signature"])
        assert not verify_signature("wrong", got.body, got.headers["X-Gpu-Auditor-Signature"])
        doc = got.json()
        assert doc["version"] == 1 and doc["kind"] == "policy.violation"
        assert doc["data"]["job"]["job"] == "Job/bad" and doc["data"]["policy"] == "low-sm"
        assert hook.requests[0].headers["X-Gpu-Auditor-Delivery"] == got.headers["X-Gpu-Auditor-Delivery"]
    finally:
        hook.close()
        store.close()


def test_malformed_policy_rejected_with_line_while_loaded_ones_keep_running(kube_admin, namespace, tmp_path, receivers):
    slack, _ = receivers
    ns = namespace
    d = tmp_path / "policies"
    d.mkdir()
    (d / "low-sm.yaml").write_text(POLICY.replace("mode: enforce", "mode: warn"))
    reg = PolicyRegistry()
    assert reg.reload_dir(d) == []
    broken = POLICY.replace("mode: enforce", "mode: warn").replace(
        '    - {field: sm_active, op: "<=", value: 0.3}\n  sustained',
        '    - {field: sm_activ, op: "<=", value: 0.3}\n  sustained',
    )
    (d / "low-sm.yaml").write_text(broken)
    problems = reg.reload_dir(d)
    line = broken.splitlines().index('    - {field: sm_activ, op: "<=", value: 0.3}') + 1
    assert len(problems) == 1 and problems[0].startswith(f"{d / 'low-sm.yaml'}:{line}:") and "sm_activ" in problems[0]
    assert [p.name for p in reg.policies] == ["low-sm"]  # the last good version keeps running
    bad = _job(kube_admin, ns, "bad")
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    _store_job(store, ns, "bad", bad["uid"], bad["pod"], 0.97, 0.1)
    s = _summary(ns, "bad", bad["pod"], bad["uid"], "low_sm_efficiency", 0.97, 0.1)
    try:
        PolicyRunner(reg, store, KubeActions(kube_admin), RunnerConfig(retry=FAST)).run_cycle([s], now=T0, act=True)
        assert _annotations(kube_admin, ns, "bad")["gpu-auditor.io/verdict"] == "low_sm_efficiency"
    finally:
        store.close()


def test_label_full_of_markup_arrives_escaped(kube_admin, namespace, tmp_path, receivers):
    slack, _ = receivers
    ns = namespace
    bad = _job(kube_admin, ns, "bad")
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    _store_job(store, ns, "bad", bad["uid"], bad["pod"], 0.97, 0.1)
    evil = "<!channel> <@U123ABC> <https://evil.example|click> <b>x</b> & @here"
    s = _summary(ns, "bad", bad["pod"], bad["uid"], "low_sm_efficiency", 0.97, 0.1, team=evil)
    config = RunnerConfig(routes={evil: Route(slack_url=slack.url)}, retry=FAST)
    runner = PolicyRunner(
        parse_policies(POLICY.replace("mode: enforce", "mode: warn"), "p.yaml"), store, KubeActions(kube_admin), config
    )
    try:
        for m in range(3):
            runner.run_cycle([s], now=T0 + timedelta(minutes=m), act=True)
        assert len(slack.accepted) == 1
        raw = slack.accepted[0].body.decode()
        for bad_text in ("<!channel>", "<@U123ABC>", "<https://evil", "<b>", " & "):
            assert bad_text not in raw
        assert "&lt;!channel&gt;" in raw and "&lt;@U123ABC&gt;" in raw and "&amp;" in raw
        assert "@here" not in raw
    finally:
        store.close()


def test_cli_act_alerts_through_the_charts_variables(prometheus, tmp_path, monkeypatch, capsys, receivers):
    """``gpu-auditor audit --policies DIR --act`` end to end (real Prometheus, no cluster): the alert
    goes where GPU_AUDITOR_SLACK_WEBHOOK_URL / GPU_AUDITOR_WEBHOOK_URL say, and the webhook is signed
    with GPU_AUDITOR_WEBHOOK_HMAC_KEY, the variable the Helm chart sets for the operator."""
    slack, hook = receivers
    case = f"act{uuid.uuid4().hex[:8]}"
    end = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=1)
    duration = backfill_spin(prometheus, case, end=end, pod=PodRef("ml", "spin-0", "main"))
    policies = tmp_path / "policies"
    policies.mkdir()
    sm_low = {"field": "sm_active", "op": "<=", "value": 0.3}
    (policies / "notify.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "gpu-auditor.io/v1alpha1",
                "kind": "GpuPolicy",
                "metadata": {"name": "notify-low-sm"},
                "spec": {
                    "mode": "warn",
                    "verdicts": ["low_sm_efficiency"],
                    "sustained": {"for": "10m", "conditions": [sm_low]},
                    "escalation": [{"actions": ["notify"]}],
                },
            }
        )
    )
    monkeypatch.setenv("GPU_AUDITOR_SLACK_WEBHOOK_URL", slack.url)
    monkeypatch.setenv("GPU_AUDITOR_WEBHOOK_URL", hook.url)
    monkeypatch.setenv("GPU_AUDITOR_WEBHOOK_HMAC_KEY", SECRET)
    monkeypatch.delenv("GPU_AUDITOR_WEBHOOK_SECRET", raising=False)

    rc = main(
        [
            "audit",
            "--prometheus",
            prometheus.url,
            "--no-kube",
            "--match",
            f"case={case}",
            "--start",
            (end - duration - timedelta(minutes=5)).isoformat(),
            "--end",
            end.isoformat(),
            "--db",
            f"sqlite:///{tmp_path}/a.db",
            "--output",
            "json",
            "--policies",
            str(policies),
            "--act",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    (summary,) = json.loads(out.out)
    assert summary["verdict"] == "low_sm_efficiency"
    (decision,) = summary["policy_decisions"]
    assert decision["policy"] == "notify-low-sm" and decision["actions"] == ["notify"], decision
    assert len(slack.accepted) == 1 and len(hook.accepted) == 1
    got = hook.accepted[0]
    assert verify_signature(SECRET, got.body, got.headers["X-Gpu-Auditor-Signature"])
    assert got.json()["data"]["job"]["job"] == "Pod/spin-0"
