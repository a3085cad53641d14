"""docs/gate.md's runbook, run on the bed: every ```console-runbook block, in order, with its output
compared to what the doc shows (issue 29, part 5), so the doc cannot drift from the product.

What the test plays, and how (the rest is the doc's commands, run by bash as written):

- the admin's shell: ``$NS $RELEASE $CHECK $CQ $FLAVOR $TEAM`` (step 0) are this test's own
  names, ``~/.kube/config`` is the bed's kubeconfig (``HOME`` is a temporary directory), and
  ``kubectl``, ``helm``, ``gpu-auditor`` and ``curl`` are the bed's and this tree's programs;
- the cluster before the runbook: the chart installed by docs/install.md's command (defaults,
  mode audit), a ClusterQueue with a GPU and a CPU flavor, a LocalQueue ``lq`` in ``$TEAM``, and
  the store holding the lineage ``train``'s last four runs (3 flagged ``low_sm_efficiency``);
- the operator's pod: the bed runs no Deployment controller, so the test runs ``gpu-auditor run``
  with the settings the chart rendered into its ConfigMap (read back from the apiserver after
  every ``helm upgrade``, as the pod restarts on the ConfigMap's checksum), as the chart's
  ServiceAccount (impersonated: the chart's RBAC applies), with the bed's Prometheus, a SQLite
  store and a free port. ``kubectl exec deploy/... -- CMD`` runs CMD here with those settings (as
  in the pod: ``--config`` defaults to them), ``kubectl port-forward`` is not run (the operator
  already listens on this machine; ``127.0.0.1:8080`` in a command is its port);
- the users: ``<!-- runbook: job NAME -->`` before a block submits a one-GPU Job NAME of lineage
  ``train`` to ``lq`` and waits until the gate answered its Workload.

Output check: each line the doc shows under a command must match a line of the real output, in
order (``…`` matches anything, runs of spaces match any spacing, ``$VAR`` is the variable's value);
a command must exit 0. To refresh the doc's output after a deliberate change,
``GPU_AUDITOR_RUNBOOK_RECORD=FILE`` writes every command's real output to FILE instead of comparing.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from gate_objects import check_state, gpu_job, record_runs, until, workload_of
from kueue_objects import KV, kueue_queue, kueue_running

from auditor.core.lineage import LineageKey
from auditor.kube.client import call_json, resource_path
from auditor.store import Store

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(not kueue_running(), reason="the bed runs without the Kueue controller"),
]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "gate.md"
FLAGGED = ["low_sm_efficiency", "low_sm_efficiency", "healthy", "low_sm_efficiency"]
VARS = ("NS", "RELEASE", "CHECK", "CQ", "FLAVOR", "TEAM")


@dataclass
class Command:
    text: str
    expected: list[str] = field(default_factory=list)


def _complete(text: str) -> bool:
    if text.endswith("\\"):
        return False
    try:
        shlex.split(text)
    except ValueError:  # an open quote: the command goes on on the next line
        return False
    return True


def runbook(text: str) -> list[tuple[str, Any]]:
    """The runbook in document order: ("job", NAME) and ("command", Command) items."""
    items: list[tuple[str, Any]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*<!-- runbook: job (\S+) -->\s*$", line)
        if m:
            items.append(("job", m.group(1)))
        fence = re.match(r"^(\s*)```console-runbook\s*$", line)
        if fence:
            indent = len(fence.group(1))
            i += 1
            current: Command | None = None
            while not re.match(r"^\s*```\s*$", lines[i]):
                body = lines[i][indent:]
                if body.startswith("$ "):
                    current = Command(body[2:])
                    while not _complete(current.text):
                        i += 1
                        current.text += "\n" + lines[i][indent:]
                    items.append(("command", current))
                elif current is not None and body.strip():
                    current.expected.append(body)
                i += 1
        i += 1
    return items


def mismatch(expected: list[str], output: str, env: dict[str, str]) -> str | None:
    """None when every expected line matches an output line, in order; else the first that does not."""
    got = [line.rstrip() for line in output.splitlines()]
    at = 0
    for line in expected:
        want = re.sub(r"\$([A-Z]+)", lambda m: env.get(m.group(1), m.group(0)), line.strip())
        parts = [r"\s+".join(re.escape(w) for w in p.split(" ")) for p in re.sub(" +", " ", want).split("…")]
        pattern = re.compile(".*".join(parts))
        while at < len(got) and not pattern.fullmatch(got[at].strip()):
            at += 1
        if at == len(got):
            return want
        at += 1
    return None


def test_the_runbook_parses_into_numbered_steps_with_commands() -> None:
    items = runbook(DOC.read_text())
    commands = [c.text for kind, c in items if kind == "command"]
    assert commands[0].startswith("helm upgrade $RELEASE charts/gpu-auditor") and "gate.enabled=true" in commands[0]
    assert any("gate.mode=enforce" in c for c in commands) and any("gate.enabled=false" in c for c in commands)
    assert [c for kind, c in items if kind == "job"] == ["train-1", "train-2"]
    assert mismatch(["a … c", "$NS  x"], "zz\na b c\nns1 x\n", {"NS": "ns1"}) is None
    assert mismatch(["a … c", "d"], "a b c\n", {}) == "d"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SHIM = """#!/bin/bash
# kubectl as the runbook's admin runs it; exec into the operator and port-forward are played here
for a in "$@"; do
  if [ "$a" = port-forward ]; then exit 0; fi
done
if [ "$1" = "-n" ] && [ "$3" = exec ]; then
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
  shift
  GPU_AUDITOR_CONFIG="$OPERATOR_SETTINGS" exec "$@"
fi
exec "$REAL_KUBECTL" "$@"
"""


class Operator:
    """``gpu-auditor run`` with the chart's rendered settings, as its ServiceAccount (see the module doc)."""

    def __init__(self, testbed: Any, work: Path, ns: str, release: str, port: int, db: str) -> None:
        self.testbed, self.work, self.ns, self.release, self.port, self.db = testbed, work, ns, release, port, db
        self.settings = work / "operator-settings.yaml"
        self.log = work / "operator.log"
        self.proc: subprocess.Popen | None = None
        (work / "policies").mkdir(exist_ok=True)

    def restart(self, api: Any) -> None:
        self.stop()
        cm = call_json(api, resource_path("v1", "configmaps", self.ns, f"{self.release}-settings"))
        dep = call_json(api, resource_path("apps/v1", "deployments", self.ns, self.release))
        sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
        s = yaml.safe_load(cm["data"]["settings.yaml"])
        s["kubernetes"] = {
            "in_cluster": False,
            "kubeconfig": str(self.testbed.kubeconfig),
            "impersonate": f"system:serviceaccount:{self.ns}:{sa}",
        }
        s["store"]["url"] = self.db
        s["prometheus"] |= {"url": self.testbed.prometheus_url, "matchers": {"case": "runbook-nothing"}}
        s["http"] = {"port": self.port, "host": "127.0.0.1"}
        s["policies"]["dir"] = str(self.work / "policies")
        s.setdefault("gate", {})["sweep_interval"] = "1s"
        self.settings.write_text(yaml.safe_dump(s))
        exe = Path(sys.executable).with_name("gpu-auditor")
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                [str(exe), "-v", "run", "--config", str(self.settings)],
                env={**os.environ, "GPU_AUDITOR_LEADER_ELECTION__IDENTITY": "runbook-operator"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        until(lambda: self._serving(), "the operator serving /healthz", 60, 0.2)

    def _serving(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


def _submit(api: Any, team: str, name: str, check: str) -> None:
    """A user's one-GPU Job ``name`` of lineage ``train``; back once the gate answered its Workload."""
    wl = workload_of(api, team, gpu_job(api, team, name, lineage="train"))["metadata"]["name"]

    def answered() -> bool:  # Ready, or Rejected (Kueue then deactivates it and may drop the state)
        got = call_json(api, resource_path(KV, "workloads", team, wl))
        return check_state(got, check).get("state") not in (None, "Pending") or got["spec"].get("active") is False

    until(
        answered,
        f"the gate's answer on {name}'s Workload",
        60,
        0.2,
    )


@pytest.fixture
def team(kube_admin, namespace) -> Iterator[str]:
    from kubernetes import client as k8s

    name = f"{namespace}-team"
    core = k8s.CoreV1Api(kube_admin)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name)


def _shell_env(testbed: Any, tmp_path: Path, names: dict[str, str], operator: Operator) -> dict[str, str]:
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text(Path(testbed.kubeconfig).read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(SHIM)
    (bin_dir / "kubectl").chmod(0o755)
    (bin_dir / "helm").symlink_to(testbed.helm)
    (bin_dir / "gpu-auditor").symlink_to(Path(sys.executable).with_name("gpu-auditor"))
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "GPU_AUDITOR_"))},
        **names,
        "HOME": str(home),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "REAL_KUBECTL": str(testbed.kubectl),
        "OPERATOR_SETTINGS": str(operator.settings),
        "HELM_CACHE_HOME": str(ROOT / ".testbed" / "helm" / "cache"),
        "HELM_CONFIG_HOME": str(ROOT / ".testbed" / "helm" / "config"),
        "HELM_DATA_HOME": str(ROOT / ".testbed" / "helm" / "data"),
    }


def test_the_gate_runbook_runs_as_written(testbed, kube_admin, namespace, team, tmp_path) -> None:
    api, case = kube_admin, uuid.uuid4().hex[:6]
    names = {
        "NS": namespace,
        "RELEASE": f"gpu-auditor-{case}",  # the chart names its objects after it (it holds gpu-auditor)
        "CHECK": f"gpu-efficiency-{case}",
        "CQ": f"cq-rb-{case}",
        "FLAVOR": f"h200-{case}",
        "TEAM": team,
    }
    db = f"sqlite:///{tmp_path}/store.db"
    store = Store.open(db)
    try:
        record_runs(store, LineageKey("default", team, "train"), FLAGGED, datetime.now(timezone.utc))
    finally:
        store.close()
    port = _free_port()
    operator = Operator(testbed, tmp_path, namespace, names["RELEASE"], port, db)
    env = _shell_env(testbed, tmp_path, names, operator)
    record = os.environ.get("GPU_AUDITOR_RUNBOOK_RECORD")
    transcript: list[str] = []

    def sh(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)

    flavors = [(names["FLAVOR"], "nvidia.com/gpu", 2), (f"cpu-{case}", "cpu", 4)]
    with kueue_queue(api, team, names["CQ"], flavors) as cq:
        installed = sh("helm install $RELEASE charts/gpu-auditor -n $NS --set mode=audit")
        assert installed.returncode == 0, installed.stderr
        try:
            operator.restart(api)
            for kind, item in runbook(DOC.read_text()):
                if kind == "job":
                    _submit(api, team, item, names["CHECK"])
                    continue
                command = item.text.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
                res = sh(command)
                transcript += [f"$ {item.text}", res.stdout.rstrip(), res.stderr.rstrip(), ""]
                assert res.returncode == 0, f"$ {item.text}\n{res.stdout}{res.stderr}"
                if item.text.startswith("helm upgrade"):
                    operator.restart(api)
                if not record:
                    wrong = mismatch(item.expected, res.stdout, names)
                    assert wrong is None, f"$ {item.text}\nexpected a line {wrong!r} in:\n{res.stdout}"
        finally:
            if record:
                Path(record).write_text("\n".join(transcript))
            operator.stop()
            sh("helm uninstall $RELEASE -n $NS --ignore-not-found")
            # the SQLite PVC is kept on uninstall, and no pvc-protection controller runs in the bed:
            # its finalizer would hold the namespace in Terminating for good
            sh(
                "kubectl -n $NS get pvc -o name | xargs -r -I{} "
                'kubectl -n $NS patch {} --type=merge -p \'{"metadata":{"finalizers":null}}\''
            )
            call_json(
                api,
                resource_path("batch/v1", "jobs", team),
                method="DELETE",
                query=[("propagationPolicy", "Background")],
            )
        assert cq == names["CQ"]
