"""Operator shards on the bed: each audits only its namespaces, with queries selecting only their
series, into one shared PostgreSQL store; a restarted shard continues from its own cursor, so no
job is audited twice or missed (docs/scale.md, "Shards").
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Iterator

import pytest
from kubeobjects import batch_job, replayed_job_pods

from auditor.core.shards import Shard, namespace_shard, ordinal_of
from auditor.engine import align_down
from auditor.kube.client import KubeConfig, api_client
from auditor.kube.resolver import KubeResolver
from auditor.operator_loop.cycle import CycleRunner
from auditor.operator_loop.shards import ShardResolver, ShardSource
from auditor.settings import Settings
from auditor.sources.prometheus import PrometheusSource
from auditor.store import Store

pytestmark = pytest.mark.testbed
INTERVAL = timedelta(seconds=15)
DURATION = timedelta(minutes=30)
WIDTH = timedelta(minutes=5)


@pytest.fixture
def namespaces(kube_admin) -> Iterator[list[str]]:
    """Two fresh namespaces, one owned by each of 2 shards."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(kube_admin)
    names: list[str] = []
    per_shard = {0: 0, 1: 0}
    while len(names) < 2:
        name = f"sh-{uuid.uuid4().hex[:10]}"
        if per_shard[namespace_shard(name, 2)] < 1:
            per_shard[namespace_shard(name, 2)] += 1
            names.append(name)
    for name in names:
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    yield names
    for name in names:
        core.delete_namespace(name)


def _runner(store: Store, resolver: KubeResolver, url: str, case: str, shard: Shard) -> CycleRunner:
    mine = ShardResolver(resolver, shard)
    return CycleRunner(
        store=store,
        source=ShardSource(PrometheusSource(url, matchers={"case": case}), mine),
        resolver=mine,
        cluster=case,
        shard=shard,
    )


def test_two_shards_split_the_namespaces_and_a_restart_misses_nothing(
    testbed, kube_admin, namespaces, prometheus, postgres_url
) -> None:
    case = f"sh{uuid.uuid4().hex[:8]}"
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    end = now.replace(minute=now.minute // 5 * 5) - timedelta(hours=2)
    for ns in namespaces:
        job = batch_job(kube_admin, ns, "train", labels={"team": "research"})
        replayed_job_pods(
            kube_admin,
            prometheus,
            ns,
            job,
            case=case,
            phase="resnet50_bf16_training",
            end=end,
            duration=DURATION,
            interval=INTERVAL,
            labels={"team": "research"},
        )
    owner = {ns: namespace_shard(ns, 2) for ns in namespaces}
    resolver = KubeResolver(api_client(KubeConfig(kubeconfig=testbed.kubeconfig)), cluster=case).start()
    try:
        assert resolver.wait_synced(60.0)
        with Store.open(postgres_url) as store:
            shards = [_runner(store, resolver, prometheus.url, case, Shard(i, 2)) for i in range(2)]
            middle = end - DURATION / 2  # the first cycles stop halfway through the jobs' data
            first = [r.run(middle) for r in shards]
            for i, result in enumerate(first):
                # each shard saw and summarized exactly its own namespaces' jobs
                assert {s.namespace for s in result.summaries} == {ns for ns, o in owner.items() if o == i}
                # its queries select only its namespaces (the bed holds other tests' GPU pods too)
                selected = set(shards[i].source._source.regex_matchers["namespace"].split("|"))
                assert selected == shards[i].resolver.namespaces
                assert {ns for ns, o in owner.items() if o == i} <= selected
                assert all(namespace_shard(ns, 2) == i for ns in selected)
            # shard 1 restarts (a new process: a new runner on the same store) and continues from
            # its own cursor, not shard 0's, and does not end shard 0's jobs
            shards[1] = _runner(store, resolver, prometheus.url, case, Shard(1, 2))
            assert shards[1].cursor() == align_down(first[1].window.end, WIDTH)
            later = end + timedelta(minutes=10)
            second = [r.run(later) for r in shards]
            assert [r.window.start for r in second] == [align_down(f.window.end, WIDTH) for f in first]
            assert len(store.open_jobs(case)) == 2  # neither shard ended the other's job
            hours = {}
            for ns in namespaces:
                job_id = store.find_job(ns, "Job", "train", case)[0]
                hours[ns] = store.summary(job_id)["gpu_hours"]
    finally:
        resolver.stop()
    # every job's whole 30 minutes counted once: 2 pods x 4 GPUs
    assert hours == {ns: pytest.approx(8 * DURATION.total_seconds() / 3600, rel=0.01) for ns in namespaces}


def test_shard_settings_follow_the_statefulset_ordinal() -> None:
    s = Settings.model_validate({"sharding": {"total_shards": 4}})
    assert s.sharding.resolve("gpu-auditor-3") == Shard(3, 4)
    assert Settings.model_validate({"sharding": {"total_shards": 4, "shard": 1}}).sharding.resolve("x") == Shard(1, 4)
    assert Settings().sharding.resolve("gpu-auditor-7") == Shard(0, 1)  # one shard: the whole cluster
    with pytest.raises(ValueError, match="no StatefulSet ordinal"):
        s.sharding.resolve("laptop")
    with pytest.raises(ValueError, match="not below"):
        s.sharding.resolve("gpu-auditor-4")
    assert ordinal_of("gpu-auditor-12") == 12 and ordinal_of("gpu-auditor") is None
    # the split is stable and even enough: 1,000 namespaces over 4 shards
    counts = [sum(namespace_shard(f"team-{i}", 4) == k for i in range(1000)) for k in range(4)]
    assert min(counts) > 200 and sum(counts) == 1000


def test_a_sharded_operator_takes_its_own_lease_and_leaves_cluster_work_to_shard_0(tmp_path, monkeypatch) -> None:
    from kubernetes import client as k8s

    from auditor.operator_loop.service import Operator
    from auditor.settings import load_settings

    monkeypatch.delenv("POD_NAME", raising=False)

    def operator(shard: int) -> Operator:
        settings = load_settings(
            None,
            environ={},
            overrides={
                "store": {"url": f"sqlite:///{tmp_path}/s{shard}.db"},
                "leader_election": {"namespace": "gpu-auditor", "identity": f"gpu-auditor-{shard}"},
                "policies": {"builtin": False},
                "prometheus": {"url": "http://127.0.0.1:9"},
                "gate": {"enabled": True},
                "sharding": {"total_shards": 3},  # the shard from the identity's ordinal
            },
        )
        return Operator(settings, api=k8s.ApiClient())

    first, last = operator(0), operator(2)
    assert (first.shard, last.shard) == (Shard(0, 3), Shard(2, 3))
    assert first.elector is not None and first.elector.name == "gpu-auditor-shard-0"
    assert last.elector is not None and last.elector.name == "gpu-auditor-shard-2"
    assert isinstance(last.resolver, ShardResolver) and isinstance(last.source, ShardSource)
    assert first.gate is not None and last.gate is None  # the gate (and reports, retention) in shard 0 only
    assert last.runner.shard == Shard(2, 3)
