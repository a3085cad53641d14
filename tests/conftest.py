"""Shared fixtures: the real local test bed (kube-apiserver + etcd, Prometheus, PostgreSQL).

A healthy test bed already running from ``make testbed-up`` (``.testbed/``) is reused and left
running; otherwise a private one is started for this session and stopped at its end. Tests that
need a server fail (never skip) when it cannot start. Such tests carry ``@pytest.mark.testbed``;
any test using one of these fixtures gets the mark automatically, so ``-m 'not testbed'`` runs
the rest without servers.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from auditor.testbed import Testbed, TestbedError, attach, down, up

if TYPE_CHECKING:
    import kubernetes.client

SERVER_FIXTURES = {"testbed", "prometheus", "postgres_url", "kube_admin", "namespace"}

#: a failure while preparing binaries before the run, reported by the fixture (not the hook)
_PREPARE_ERROR: list[BaseException] = []


#: Modules that need no server but take seconds (real SQLite files, subprocesses, whole-trace
#: replays, image builds): marked ``slow``, so ``make test-fast`` (``-m "not testbed and not slow"``)
#: keeps to pure logic and adapter logic behind fakes of our ports. Measured with
#: ``pytest -m "not testbed" --durations=0``; a module over ~1 s in total belongs here.
SLOW_MODULES = {
    "tests/audit/test_audit_traces.py",
    "tests/audit/test_trace_verdicts.py",
    "tests/chart/test_image.py",
    "tests/cli/test_demo.py",
    "tests/cli/test_status.py",
    "tests/console/test_console_browser.py",
    "tests/console/test_console_pages.py",
    "tests/cli/test_thresholds_settings.py",
    "tests/gate/test_ack_cli.py",
    "tests/gate/test_lineage_explain.py",
    "tests/operator/test_cycle_stability.py",
    "tests/operator/test_fleet_metrics.py",
    "tests/operator/test_retention_stage.py",
    "tests/policy/test_gate_policies.py",
    "tests/policy/test_policy_ranges.py",
    "tests/policy/test_policy_units.py",
    "tests/policy/test_yaml_bounds.py",
    "tests/reports/test_demo_report.py",
    "tests/reports/test_report_fit.py",
    "tests/reports/test_report_queue_wait.py",
    "tests/reports/test_report_store.py",
    "tests/reports/test_report_units.py",
    "tests/reports/test_store_sources.py",
    "tests/testbed/test_watchdog.py",
}

#: Tests that need the bed's real node (kubelet + containerd, docs/testbed.md): a private bed
#: started for a session holding them gets the node, and its images are built before the run.
NODE_TESTS = "tests/node/"
NODE_IMAGE_ENV = "GPU_AUDITOR_NODE_TEST_IMAGE"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent.parent
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.testbed)
        rel = Path(str(item.fspath)).resolve().relative_to(root.resolve()).as_posix()
        if rel in SLOW_MODULES or rel.startswith("tests/store/"):
            item.add_marker(pytest.mark.slow)


def _attach_shared() -> Testbed | None:
    """The running shared test bed, looking again for a few seconds when one is there but a
    probe failed: another process's backfill restarts its Prometheus for ~0.3 s, and a private
    bed started for that blip costs ~20 s (and, under a shifted clock, certificates the real
    apiserver rejects)."""
    from auditor.testbed import config

    for _ in range(5):
        bed = attach()
        if bed is not None or not (config.default_state_dir() / "state.json").exists():
            return bed
        time.sleep(1)
    return None


def _wants_node(session: pytest.Session) -> bool:
    root = Path(str(session.config.rootpath)).resolve()
    return any(
        Path(str(item.fspath)).resolve().relative_to(root).as_posix().startswith(NODE_TESTS) for item in session.items
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the Go binaries (and, for the node tests, the images) before the run if needed: a
    cold build takes minutes, longer than the per-test timeout, which would otherwise count it
    against the first test."""
    if not any(item.get_closest_marker("testbed") for item in session.items):
        return
    from auditor.testbed import binaries, image, node

    switch = os.environ.get(node.NODE_SWITCH, "").strip().lower()
    with_node = _wants_node(session) and switch not in ("0", "false", "no", "off")
    shared = _attach_shared()
    if with_node and shared is None:
        os.environ[node.NODE_SWITCH] = "1"  # the private bed this session starts gets the node
    capture = session.config.pluginmanager.getplugin("capturemanager")
    try:
        with capture.global_and_fixture_disabled():
            if shared is None:
                binaries.build()
                binaries.crd_files()
            if any(item.path.name == "test_floor_apiserver.py" for item in session.items):
                from auditor.testbed import floor

                floor.build()  # the chart's floor kube-apiserver (cold: many minutes)
            # the node tests run this tree's image (on a shared bed too: it may be older)
            if with_node and not node.missing_packages():
                image.build_pause()
                # built once per session, from the tree as the run starts (others may edit it
                # meanwhile); the node tests import this one (tests/node/conftest.py). An archive
                # named in the environment beforehand is tested instead.
                if not os.environ.get(NODE_IMAGE_ENV):
                    os.environ[NODE_IMAGE_ENV] = str(image.build_product().archive)
    except Exception as exc:  # noqa: BLE001 - reported by the `testbed` fixture as a failure
        _PREPARE_ERROR.append(exc)


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """The running test bed: attributes ``kubeconfig, prometheus_url, prometheus_data_dir,
    database_url, kubectl, helm, promtool`` (strings, as in ``.testbed/env``)."""
    if _PREPARE_ERROR:
        pytest.fail(f"test bed binaries could not be prepared: {_PREPARE_ERROR[0]}", pytrace=False)
    shared = _attach_shared()
    if shared is not None:
        yield shared
        return
    private_dir = tmp_path_factory.mktemp("testbed")
    try:
        bed = up(private_dir, owner_pid=os.getpid())  # stopped by a watchdog if this pytest is killed
    except TestbedError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield bed
    finally:
        down(private_dir, quiet=True)


@dataclass
class PrometheusHandle:
    """The test bed's Prometheus: ``url``, ``data_dir`` and ``backfill(openmetrics_text)``."""

    url: str
    data_dir: str
    _bed: Testbed = field(repr=False)

    def backfill(self, openmetrics_text: str) -> None:
        """Write the samples as TSDB blocks and restart Prometheus: queryable on return.

        A trailing ``# EOF`` is added when missing. All tests share one TSDB: give your series
        a unique label value (e.g. a uuid in ``namespace`` or a ``case`` label).
        """
        self._bed.backfill(openmetrics_text)


@pytest.fixture
def prometheus(testbed: Testbed) -> PrometheusHandle:
    return PrometheusHandle(url=testbed.prometheus_url, data_dir=testbed.prometheus_data_dir, _bed=testbed)


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


@pytest.fixture
def postgres_url(testbed: Testbed) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this test (``postgresql://...``), dropped afterwards."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(testbed.postgres_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(testbed.postgres_admin_url, name)
    finally:
        with psycopg.connect(testbed.postgres_admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def kube_admin(testbed: Testbed) -> Iterator[kubernetes.client.ApiClient]:
    """A ``kubernetes.client.ApiClient`` for the admin user (``system:masters``)."""
    from kubernetes import config as kube_config

    client = kube_config.new_client_from_config(config_file=testbed.kubeconfig)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def namespace(kube_admin: kubernetes.client.ApiClient) -> Iterator[str]:
    """A fresh namespace for this test; deleted afterwards (the namespace controller finalizes it)."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    name = f"t-{uuid.uuid4().hex[:12]}"
    core = k8s.CoreV1Api(kube_admin)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels={"gpu-auditor.io/test": "true"})))
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.testbed)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store on SQLite, then on the test bed's PostgreSQL: every store test runs on both."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    return request.getfixturevalue("postgres_url")
