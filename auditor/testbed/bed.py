"""Bring the whole test bed up or down, attach to a running one, report its health.

``up`` starts three chains in parallel (etcd → kube-apiserver → controller manager and CRDs →
Kueue and its webhooks; Prometheus; PostgreSQL), so a warm start costs about as long as the apiserver takes to get ready.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from auditor.testbed import binaries, config, kube, kueue, node, postgres, process, prometheus
from auditor.testbed.errors import TestbedError
from auditor.testbed.pki import Pki, generate
from auditor.testbed.state import State

#: The node's processes (node.py), in stop order.
NODE_COMPONENTS = ("deviceplugin", "kubelet", "containerd")
#: Stop order: dependants first (Kueue's webhooks sit in front of the apiserver's writes).
STOP_ORDER = (
    *NODE_COMPONENTS,
    "kueue",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
    "prometheus",
    "postgresql",
)


def components(state: State | None = None) -> tuple[str, ...]:
    """The components a complete bed runs: all of STOP_ORDER, less Kueue when it is switched off,
    less the node when it is switched off, could not start on this machine (``node_error``) or
    was not asked for when the running bed started (a bed from before the node stays reusable:
    its users keep it, the node's tests say to restart it)."""
    if state is None:
        return tuple(n for n in STOP_ORDER if (n != "kueue" or config.kueue_enabled()) and n not in NODE_COMPONENTS)
    asked = bool(state.values.get("node_requested")) and node.enabled(state.dir)
    no_node = not asked or bool(state.values.get("node_error"))
    return tuple(
        n for n in STOP_ORDER if (n != "kueue" or config.kueue_enabled()) and (n not in NODE_COMPONENTS or not no_node)
    )


ENV_KEYS = ("KUBECONFIG", "PROMETHEUS_URL", "PROMETHEUS_DATA_DIR", "DATABASE_URL", "KUBECTL", "HELM", "PROMTOOL")


@dataclass(frozen=True)
class Testbed:
    """Connection settings of a running test bed (all strings, as in ``.testbed/env``)."""

    state_dir: str
    kubeconfig: str
    apiserver_url: str
    prometheus_url: str
    prometheus_data_dir: str
    database_url: str
    postgres_admin_url: str  # the ``postgres`` maintenance database, for CREATE/DROP DATABASE
    kubectl: str
    helm: str
    promtool: str
    kueue_namespace: str = ""  # empty when the bed runs without the Kueue controller
    image: str = ""  # the product image (repo:tag) the node's containerd holds; empty without a node
    node_name: str = ""  # the real node's name; empty without a node

    def env(self) -> dict[str, str]:
        kueue_env = {"KUEUE_NAMESPACE": self.kueue_namespace, "KUEUE_VERSION": config.KUEUE_VERSION}
        return {
            "KUBECONFIG": self.kubeconfig,
            "PROMETHEUS_URL": self.prometheus_url,
            "PROMETHEUS_DATA_DIR": self.prometheus_data_dir,
            "DATABASE_URL": self.database_url,
            "KUBECTL": self.kubectl,
            "HELM": self.helm,
            "PROMTOOL": self.promtool,
            "TESTBED_DIR": self.state_dir,
            "KUBE_APISERVER_URL": self.apiserver_url,
            **(kueue_env if self.kueue_namespace else {}),
            **({"GPU_AUDITOR_IMAGE": self.image, "TESTBED_NODE": self.node_name} if self.node_name else {}),
        }

    def backfill(self, openmetrics_text: str) -> None:
        """Backfill history into this test bed's Prometheus; queryable when this returns."""
        from auditor.testbed.backfill import backfill

        backfill(Path(self.state_dir), openmetrics_text)


def _say(msg: str) -> None:
    print(f"testbed: {msg}", file=sys.stderr, flush=True)


def _testbed_from(state: State) -> Testbed | None:
    v = state.values
    try:
        return Testbed(
            state_dir=str(state.dir),
            kubeconfig=v["kubeconfig"],
            apiserver_url=v["apiserver_url"],
            prometheus_url=v["prometheus_url"],
            prometheus_data_dir=v["prometheus_data_dir"],
            database_url=v["database_url"],
            postgres_admin_url=v["postgres_admin_url"],
            kubectl=v["kubectl"],
            helm=v["helm"],
            promtool=v["promtool"],
            kueue_namespace=v.get("kueue_namespace", "") if "kueue" in state.procs else "",
            image=v.get("node_image", "") if "kubelet" in state.procs else "",
            node_name=v.get("node_name", "") if "kubelet" in state.procs else "",
        )
    except KeyError:
        return None


def health(state_dir: Path) -> dict[str, dict[str, object]]:
    """Per component: pid, whether its process runs, whether it answers, resident memory."""
    state = State.load(state_dir)
    report: dict[str, dict[str, object]] = {}
    if state is None:
        return report
    answers = {
        "kube-apiserver": kube.healthy(state),
        "prometheus": prometheus.healthy(state),
        "postgresql": postgres.healthy(state),
        "kueue": kueue.healthy(state),
        "kubelet": node.healthy(state),
    }
    for name in STOP_ORDER:
        proc = state.procs.get(name)
        if proc is None:
            continue
        running = process.alive(proc.pid, proc.marker)
        report[name] = {
            "pid": proc.pid,
            "running": running,
            "healthy": running and answers.get(name, True),
            "rss_bytes": process.rss_bytes(proc.pid) if running else 0,
            "log": proc.log,
            "ports": proc.ports,
        }
    return report


def attach(state_dir: Path | None = None) -> Testbed | None:
    """The running test bed in ``state_dir`` if every component runs and answers, else None."""
    state_dir = state_dir or config.default_state_dir()
    state = State.load(state_dir)
    if state is None or not state.values.get("complete") or _other_kueue(state):
        return None
    report = health(state_dir)
    if set(report) != set(components(state)) or not all(r["healthy"] for r in report.values()):
        return None
    return _testbed_from(state)


def _other_kueue(state: State) -> str | None:
    """The Kueue version a bed runs when it is not the one asked for (``config.KUEUE_VERSION``):
    such a bed is not reused, and not replaced either (others may be testing on it)."""
    running = (state.values.get("versions") or {}).get("kueue")
    if running and config.kueue_enabled() and running != config.KUEUE_VERSION:
        return str(running)
    return None


def _safe_to_wipe(state_dir: Path) -> bool:
    if not state_dir.exists():
        return True
    entries = {p.name for p in state_dir.iterdir()}
    return not entries or "state.json" in entries or "env" in entries


@contextmanager
def _exclusive(state_dir: Path) -> Iterator[None]:
    """One ``up``/``down`` at a time per state directory (two `make testbed-up` must not race).

    The lock file lives in the cache, not in the state directory, which ``up`` wipes.
    """
    key = hashlib.sha1(str(state_dir).encode()).hexdigest()[:16]
    with binaries.file_lock(config.cache_dir() / "locks" / f"testbed-{key}.lock"):
        yield


def up(state_dir: Path | None = None, *, build_log: Path | None = None, owner_pid: int | None = None) -> Testbed:
    """Reuse a healthy running test bed, else start a fresh one; write ``<state_dir>/env``.

    With ``owner_pid`` a fresh bed is stopped when that process is gone, however it ended
    (``watchdog.py``): a pytest session's private bed never outlives a killed pytest.
    """
    state_dir = (state_dir or config.default_state_dir()).resolve()
    with _exclusive(state_dir):
        return _up(state_dir, build_log, owner_pid)


def _up(state_dir: Path, build_log: Path | None, owner_pid: int | None = None) -> Testbed:
    t0 = time.monotonic()
    existing = attach(state_dir)
    # A backfill restarts Prometheus for ~0.3 s; a probe landing then must not get a running test
    # bed wiped, so look again a few times before starting afresh.
    for _ in range(5):
        if existing is not None or State.load(state_dir) is None:
            break
        time.sleep(1)
        existing = attach(state_dir)
    if existing is not None:
        _say(f"reusing the healthy test bed in {state_dir}")
        return existing
    previous = State.load(state_dir)
    running = _other_kueue(previous) if previous and previous.values.get("complete") else None
    if running and previous and all(process.alive(p.pid, p.marker) for p in previous.procs.values()):
        raise TestbedError(
            "kueue version",
            f"the bed in {state_dir} runs Kueue {running}, {config.KUEUE_VERSION} was asked for "
            f"({config.KUEUE_VERSION_SWITCH}); not replacing a running bed: stop it first or give "
            "GPU_AUDITOR_TESTBED_DIR another directory",
        )
    _down(state_dir, quiet=True)
    if not _safe_to_wipe(state_dir):
        raise TestbedError("state directory", f"{state_dir} exists and does not look like a test bed's; not wiping it")
    if state_dir.exists():
        shutil.rmtree(state_dir)
    state_dir.mkdir(parents=True)
    if owner_pid is not None:
        # imported here: `python -m auditor.testbed.watchdog` must not find it imported already
        from auditor.testbed import watchdog

        State(state_dir).set(watchdog_pid=watchdog.spawn(state_dir, owner_pid), owner_pid=owner_pid)

    bins = binaries.locate(build_log)
    crd_files = binaries.crd_files()
    kueue_manifests = binaries.kueue_manifests() if bins.kueue else None
    t_bins = time.monotonic()
    state = State.load(state_dir) or State(state_dir)
    pki: Pki = generate(state_dir / "pki")
    kubeconfig = state_dir / "kube" / "admin.kubeconfig"
    state.set(
        pki_dir=str(pki.dir),
        kubeconfig=str(kubeconfig),
        kubectl=str(bins.kubectl),
        helm=str(bins.helm),
        promtool=str(bins.promtool),
        node_requested=node.enabled(state_dir),
        versions={
            "kubernetes": config.K8S_VERSION,
            "etcd": config.ETCD_VERSION,
            "helm": config.HELM_VERSION,
            **({"kueue": config.KUEUE_VERSION} if bins.kueue else {}),
        },
    )

    def kube_chain() -> None:
        etcd_url = kube.start_etcd(state, bins)
        api = kube.start_apiserver(state, bins, pki, etcd_url)
        kube.write_kubeconfig(kubeconfig, api, pki)
        with ThreadPoolExecutor(2) as pool:
            kcm = pool.submit(kube.start_controller_manager, state, bins, pki, kubeconfig)
            crds = pool.submit(kube.apply_crds, state, bins, pki, kubeconfig, crd_files)
            kcm.result()
            crds.result()
        if bins.kueue and kueue_manifests:
            kueue.start(state, bins.kueue, pki, kubeconfig, api, bins.kubectl, *kueue_manifests)
        if node.enabled(state.dir):
            _start_node(state, bins, pki, kubeconfig)

    with ThreadPoolExecutor(3) as pool:
        futures = [
            pool.submit(
                _guard,
                "kubernetes control plane (etcd, kube-apiserver, controller manager, CRDs, Kueue)",
                state,
                kube_chain,
            ),
            pool.submit(_guard, "prometheus", state, lambda: prometheus.start(state, bins)),
            pool.submit(_guard, "postgresql", state, lambda: postgres.start(state, bins)),
        ]
        errors = [f.exception() for f in futures]
    failures = [e for e in errors if e is not None]
    if failures:
        _down(state_dir, quiet=True)
        first = next((e for e in failures if isinstance(e, TestbedError)), failures[0])
        for other in failures:
            if other is not first:
                _say(f"also failed: {other}")
        raise first

    state.set(complete=True, started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    bed = _testbed_from(state)
    assert bed is not None
    write_env(bed)
    _say(
        f"up in {time.monotonic() - t0:.1f} s (servers {time.monotonic() - t_bins:.1f} s); "
        f"settings: . {state_dir / 'env'}"
    )
    return bed


def _start_node(state: State, bins: binaries.Binaries, pki: Pki, kubeconfig: Path) -> None:
    """The node is part of the bed only if it can start here: a failure is recorded
    (``node_error``, shown by ``status``) and the rest of the bed runs without it."""
    try:
        node.start(state, bins.kubelet, pki, kubeconfig)
    except TestbedError as exc:
        _say(f"the node could not start, the bed runs without it: {exc}")
        node.clean(state)
        for name in NODE_COMPONENTS:
            proc = state.procs.pop(name, None)
            if proc is not None:
                process.stop(proc.pid, proc.marker, proc.stop_signal)
        state.set(node_error=str(exc))


def _guard(component: str, state: State, fn: Callable[[], object]) -> None:
    """Run one start-up chain; an unexpected exception becomes a TestbedError naming the chain."""
    try:
        fn()
    except TestbedError:
        raise
    except Exception as exc:
        raise TestbedError(component, f"{type(exc).__name__}: {exc} (logs in {state.dir / 'logs'})") from exc


def write_env(bed: Testbed) -> Path:
    path = Path(bed.state_dir) / "env"
    lines = [f"# gpu-auditor test bed (python -m auditor.testbed up); source it: . {path}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in bed.env().items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def down(state_dir: Path | None = None, *, quiet: bool = False) -> int:
    """Stop every process the test bed recorded (by pid and process group). Returns how many ran."""
    state_dir = (state_dir or config.default_state_dir()).resolve()
    with _exclusive(state_dir):
        return _down(state_dir, quiet)


def _down(state_dir: Path, quiet: bool) -> int:
    state = State.load(state_dir)
    if state is None:
        if not quiet:
            _say(f"nothing to stop in {state_dir}")
        return 0
    stopped = 0
    node.clean(state)
    names = [n for n in STOP_ORDER if n in state.procs] + [n for n in state.procs if n not in STOP_ORDER]
    for name in names:
        proc = state.procs[name]
        t0 = time.monotonic()
        if process.stop(proc.pid, proc.marker, proc.stop_signal):
            stopped += 1
            if not quiet:
                _say(f"stopped {name} (pid {proc.pid}, {time.monotonic() - t0:.1f} s)")
    postgres.remove_dir(state)
    state.procs.clear()
    state.values["complete"] = False
    state.save()
    (state_dir / "env").unlink(missing_ok=True)
    return stopped


def status_lines(state_dir: Path | None = None) -> tuple[bool, list[str]]:
    state_dir = (state_dir or config.default_state_dir()).resolve()
    report = health(state_dir)
    if not report:
        return False, [f"no test bed in {state_dir}"]
    lines = []
    total = 0
    for name, r in report.items():
        rss = int(r["rss_bytes"])  # type: ignore[call-overload]
        total += rss
        flag = "ok" if r["healthy"] else ("RUNNING, NOT ANSWERING" if r["running"] else "DOWN")
        lines.append(f"{name:24} {flag:22} pid {r['pid']:<8} rss {rss / 2**20:7.1f} MiB  ports {r['ports']}")
    lines.append(f"{'total':24} {'':22} {'':12} rss {total / 2**20:7.1f} MiB")
    state = State.load(state_dir)
    if state is not None and state.values.get("node_error"):
        lines.append(f"{'node':24} {'not started':22} {state.values['node_error'].splitlines()[0][:160]}")
    ok = set(report) == set(components(state)) and all(r["healthy"] for r in report.values())
    return ok, lines
