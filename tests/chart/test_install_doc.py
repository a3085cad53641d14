"""docs/install.md, run as written: its ```sh install-test blocks, in order, against the test bed.

The page is what a new admin follows top to bottom; this test is that admin. It copies the working
tree as a checkout holds it (``git ls-files``), sets the page's variables to the bed's (a fresh
namespace and release, the bed's Prometheus, a registry it starts on loopback), and runs each block
in ``bash -euo pipefail`` from the copy, the shell's exported variables carried from block to
block. A command that fails fails the test with the block and its output.

What the bed cannot be, it is told here and nowhere in the page (docs/install.md, "How this page
is tested"): ``make image`` builds on the bed's Debian base in the bed's buildah storage; ``helm``
install/upgrade also get the node tests' post-renderer (tests/node/postrender.py) and a values file
for the bed's plumbing; ``kubectl exec`` runs in the pod's container through containerd (the
bed's apiserver cannot reach the kubelet's streaming port). The Deployment/ReplicaSet/DaemonSet
controllers and the node tests' scheduler run for the module (tests/node/conftest.py).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest
import requests
import yaml
from kubeobjects import batch_job, create_pod

from auditor.testbed import config, image, node, process
from auditor.testbed.errors import TestbedError
from auditor.testbed.state import State

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "install.md"
NODE_TESTS = ROOT / "tests" / "node"
STEPS_END = "\n# Reference\n"

#: The page's ```sh blocks that the test does not run, by their first line, and why.
NOT_RUN = {
    "cosign verify ghcr.io/gpu-auditor/gpu-auditor:$VERSION \\": "checks ghcr.io's signature; the bed reaches no registry but its own",
    'kubectl -n "$NAMESPACE" port-forward deploy/"$RELEASE" 8080   # then http://127.0.0.1:8080/console/': (
        "port-forward needs the kubelet's streaming port, which the bed's apiserver cannot reach"
    ),
    "# GPU Operator: the ConfigMap must live in the GPU Operator's namespace.": "needs the GPU Operator's ClusterPolicy (no GPU Operator on the bed)",
    "kubectl -n gpu-auditor create secret generic gpu-auditor-db \\": (
        "the reference's PostgreSQL example (an external database's URL); the test's install uses the bed's PostgreSQL"
    ),
    ".venv/bin/python -m pytest tests/chart": "runs the chart's tests themselves",
}


def run_blocks(text: str) -> list[str]:
    """The install-test blocks of steps 0-8, in page order."""
    steps = text.split(STEPS_END, 1)[0]
    return re.findall(r"^```sh install-test\n(.*?)^```$", steps, flags=re.M | re.S)


def test_every_shell_block_is_run_or_listed():
    """A command added to the page is run by the test, or listed here with the reason it is not."""
    text = DOC.read_text()
    assert STEPS_END in text, "docs/install.md lost its '# Reference' heading (where the run steps end)"
    blocks = run_blocks(text)
    assert len(blocks) >= 10, blocks
    assert not re.search(r"^```sh install-test", text.split(STEPS_END, 1)[1], flags=re.M), (
        "install-test blocks after '# Reference' are not run: move them into the steps"
    )
    unmarked = [b.splitlines()[0] for b in re.findall(r"^```sh\n(.*?)^```$", text, flags=re.M | re.S)]
    assert sorted(unmarked) == sorted(NOT_RUN), "sh blocks neither run nor listed in NOT_RUN (or listed, but gone)"
    joined = "\n".join(blocks)
    for needed in (
        "make image",
        "make push REGISTRY=",
        "helm upgrade --install",
        "gpu-auditor doctor",
        "mode: enforce",
    ):
        assert needed in joined, needed


def _load_node_conftest():
    """The node tests' fixtures (workload controllers and scheduler, a module database), loaded
    by path: tests/node is not a package, and its conftest is only loaded when tests/node is."""
    sys.path.insert(0, str(NODE_TESTS))
    spec = importlib.util.spec_from_file_location("node_tests_conftest", NODE_TESTS / "conftest.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


_node_conftest = _load_node_conftest()
workload_controllers = _node_conftest.workload_controllers
module_database = _node_conftest.module_database
from nodelib import postrender_args  # noqa: E402 - tests/node is on sys.path from here on
from test_chart_on_node import PHASE, TRACE, _backfill_history  # noqa: E402


@dataclass(frozen=True)
class BedNode:
    name: str
    state: State


@pytest.fixture(scope="module")
def bed_node(testbed) -> BedNode:
    """The bed's node (the workload_controllers fixture asks for it by this name)."""
    state = State.load(Path(testbed.state_dir))
    if not testbed.node_name or state is None:
        pytest.fail("the test bed has no node (docs/testbed.md, 'The node')", pytrace=False)
    return BedNode(testbed.node_name, state)


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Iterator[str]:
    """A registry on loopback (Debian's docker-registry, the CNCF distribution registry): host:port."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("docker-registry not found (Debian package docker-registry; `make system-deps` installs it)")
    work = tmp_path_factory.mktemp("registry")
    addr = f"127.0.0.1:{process.free_port()}"
    conf = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(work / "data")}},
        "http": {"addr": addr},
    }
    (work / "config.yml").write_text(yaml.safe_dump(conf))
    log = open(work / "registry.log", "wb")
    proc = subprocess.Popen([binary, "serve", str(work / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"http://{addr}/v2/", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (work / "registry.log").read_text()
            time.sleep(0.2)
        yield addr
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


SHIM = """\
import json, os, socket, subprocess, sys

cfg = json.loads(os.environ["INSTALL_DOC_SHIM"])
tool, args = sys.argv[1], sys.argv[2:]
if tool == "helm":
    extra = []
    if args[:1] in (["install"], ["upgrade"]):
        # host network: a fresh port on every roll (the old pod keeps its port until the new one is
        # Ready, maxUnavailable 0)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            extra = [*cfg["helm_extra"], "--set", f"metrics.port={s.getsockname()[1]}"]
    os.execv(cfg["helm"], [cfg["helm"], *args, *extra])
if "exec" not in args or "--" not in args:
    os.execv(cfg["kubectl"], [cfg["kubectl"], *args])
# kubectl [-n NS] exec [-n NS] deploy/NAME -- CMD...: run CMD in the pod's container by containerd
cut = args.index("--")
opts, cmd = args[:cut], args[cut + 1 :]
ns, target, i = "default", None, 0
while i < len(opts):
    a = opts[i]
    if a in ("-n", "--namespace"):
        ns, i = opts[i + 1], i + 2
        continue
    if a.startswith("--namespace="):
        ns = a.split("=", 1)[1]
    elif not a.startswith("-") and a != "exec" and target is None and opts.index("exec") < i:
        target = a
    i += 1
kind, name = target.split("/", 1)
assert kind in ("deploy", "deployment", "deployment.apps"), target
def get(*what):
    out = subprocess.run([cfg["kubectl"], "-n", ns, "get", *what, "-o", "json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)
sel = get("deployment", name)["spec"]["selector"]["matchLabels"]
pods = get("pods", "-l", ",".join(f"{k}={v}" for k, v in sel.items()))["items"]
ready = [p for p in pods if not p["metadata"].get("deletionTimestamp")
         and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
if not ready:
    sys.exit(f"error: no ready pod of deployment {name} in {ns}")
cid = ready[0]["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
argv = ["ctr", "--address", cfg["containerd"], "-n", "k8s.io", "tasks", "exec", "--exec-id", f"doc-{os.getpid()}", cid, *cmd]
sys.exit(subprocess.run(argv).returncode)
"""


def _shims(work: Path) -> Path:
    bin_dir = work / "shims"
    bin_dir.mkdir()
    (bin_dir / "shim.py").write_text(SHIM)
    for tool in ("helm", "kubectl"):
        exe = bin_dir / tool
        exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{bin_dir / "shim.py"}" {tool} "$@"\n')
        exe.chmod(0o755)
    return bin_dir


def _checkout_copy(dest: Path) -> Path:
    """The working tree as a checkout holds it: tracked files and new ones git does not ignore."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for rel in filter(None, (p.decode() for p in listed)):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.mark.testbed
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_install_doc_runs_on_the_bed(testbed, bed_node, workload_controllers, module_database, registry, tmp_path):
    from kubernetes import client as k8s
    from kubernetes import config as kube_config

    blocks = run_blocks(DOC.read_text())
    suffix = uuid.uuid4().hex[:6]
    namespace, release, case = f"t-doc-{suffix}", f"gpu-auditor-{suffix}", f"doc{suffix}"
    work = tmp_path
    checkout = _checkout_copy(work / "checkout")
    bed_values = work / "bed-values.yaml"
    bed_values.write_text(
        yaml.safe_dump(
            {
                "replicas": 1,
                "store": {"type": "postgresql", "postgresql": {"urlSecret": {"name": "install-doc-db"}}},
                "extraSettings": {"prometheus": {"matchers": {"case": case}, "label_convention": "pod"}},
            }
        )
    )
    shim_config = {
        "helm": testbed.helm,
        "kubectl": testbed.kubectl,
        "containerd": str(node.containerd_socket(bed_node.state)),
        "helm_extra": ["-f", str(bed_values), *postrender_args(testbed, [], TRACE, PHASE)],
    }
    shims = _shims(work)
    buildah_store = config.cache_dir() / "buildah"
    storage_conf = work / "storage.conf"
    storage_conf.write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{buildah_store / "root"}"\nrunroot = "{buildah_store / "run"}"\n'
    )
    build_flags = ["--network", "host"]
    if image.HOST_CA.is_file():
        build_flags += ["--volume", f"{image.HOST_CA}:/run/host-ca.crt:ro", "--build-arg", "PIP_CERT=/run/host-ca.crt"]
    (work / "home").mkdir()
    env = {
        "PATH": f"{shims}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(work / "home"),
        "KUBECONFIG": testbed.kubeconfig,
        "INSTALL_DOC_SHIM": json.dumps(shim_config),
        # the page's variables (step 0 keeps a value already set)
        "NAMESPACE": namespace,
        "RELEASE": release,
        "CLUSTER_NAME": f"doc-{suffix}",
        "PROMETHEUS_URL": testbed.prometheus_url,
        "REGISTRY": f"{registry}/ml-platform",
        # make image / make push on the bed (no Docker Hub, a plain-HTTP registry)
        "CONTAINER_TOOL": "buildah",
        "CONTAINERS_STORAGE_CONF": str(storage_conf),
        "PYTHON_IMAGE": image.base_image(),
        "IMAGE_BUILD_FLAGS": " ".join(build_flags),
        "PUSH_FLAGS": "--tls-verify=false",
    }
    api = kube_config.new_client_from_config(config_file=testbed.kubeconfig)
    core = k8s.CoreV1Api(api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    core.create_namespaced_secret(
        namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="install-doc-db"), string_data={"url": module_database})
    )
    # a GPU job that has run for an hour when the operator starts: its first cycle audits it
    work_ns = f"{namespace}-work"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=work_ns)))
    job = batch_job(api, work_ns, "train")
    started = datetime.now(timezone.utc) - timedelta(hours=1)
    create_pod(api, work_ns, "train-0", gpus=1, owner=job, node=f"{case}-node", started=started)
    exported = work / "exported.sh"
    exported.write_text("")
    pulled: list[str] = []
    timings: list[str] = []
    try:
        for n, block in enumerate(blocks):
            if "--create-namespace" in block:  # the first install
                _backfill_history(testbed, work_ns, "train-0", case)  # an hour of one-SM spin (H200)
            if "gpu-auditor status" in block:
                _wait_for_first_cycle(env, namespace, release)
            script = f"set -euo pipefail\n. {exported}\n{block}\nexport -p > {exported}\n"
            t0 = time.monotonic()
            proc = subprocess.run(
                ["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True, timeout=1800
            )
            timings.append(f"block {n}: {time.monotonic() - t0:.0f} s")
            print(f"--- block {n} ({timings[-1]}):\n{block}{proc.stdout}{proc.stderr}", file=sys.stderr)
            assert proc.returncode == 0, (
                f"docs/install.md block {n} exited {proc.returncode}:\n{block}\n--- stdout\n{proc.stdout[-6000:]}"
                f"\n--- stderr\n{proc.stderr[-6000:]}"
            )
            if "make push" in block:
                version = re.search(r'^version = "(.*)"$', (ROOT / "pyproject.toml").read_text(), flags=re.M)
                assert version
                pulled.append(f"{registry}/ml-platform/gpu-auditor:{version.group(1)}")
            if "rollout status" in block:
                _assert_pod_runs_the_pushed_image(core, namespace, pulled)
        assert not core.list_namespaced_pod(namespace).items or _gone(core, namespace), "uninstall left pods"
        print("install doc timings: " + ", ".join(timings), file=sys.stderr)
    finally:
        subprocess.run(
            [
                testbed.helm,
                f"--kubeconfig={testbed.kubeconfig}",
                "uninstall",
                release,
                "-n",
                namespace,
                "--ignore-not-found",
            ],
            capture_output=True,
            timeout=300,
        )
        # the job's pod is bound to no real node: no kubelet confirms its deletion, so force it
        core.delete_collection_namespaced_pod(work_ns, grace_period_seconds=0)
        for ns in (namespace, work_ns):
            core.delete_namespace(ns, grace_period_seconds=0)
        for ref in pulled:
            subprocess.run(
                ["ctr", "--address", str(node.containerd_socket(bed_node.state)), "-n", "k8s.io", "images", "rm", ref],
                capture_output=True,
            )
        version_tag = pulled[0].rsplit(":", 1)[1] if pulled else ""
        for ref in [f"ghcr.io/gpu-auditor/gpu-auditor:{version_tag}", *pulled] if version_tag else []:
            try:
                image.buildah("rmi", ref)
            except TestbedError:
                pass  # not built (the test failed before), or already gone
        api.close()


def _wait_for_first_cycle(env: dict, namespace: str, release: str, timeout: float = 300) -> None:
    """The page's step 5 is read after the operator has audited; here, once its first cycle is in."""
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.run(
            ["kubectl", "-n", namespace, "exec", f"deploy/{release}", "--", "gpu-auditor", "status", "-o", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode == 0:
            return
        assert time.monotonic() < deadline, f"no first cycle after {timeout:.0f} s:\n{proc.stdout}\n{proc.stderr}"
        time.sleep(5)


def _assert_pod_runs_the_pushed_image(core, namespace: str, pushed: list[str]) -> None:
    """The node pulled what `make push` pushed: the container's image is the registry's."""
    pods = core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/component=operator").items
    images = {c.image for p in pods for c in p.status.container_statuses or []}
    assert pushed and images and all(any(i.endswith(ref) for ref in pushed) for i in images), (images, pushed)


def _gone(core, namespace: str, timeout: float = 120) -> bool:
    deadline = time.monotonic() + timeout
    while core.list_namespaced_pod(namespace).items:
        if time.monotonic() > deadline:
            return False
        time.sleep(2)
    return True
