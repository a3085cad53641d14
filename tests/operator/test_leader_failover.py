"""Two operator processes on one Lease: only the leader audits; a crashed leader is replaced
once its lease has expired, a cleanly stopped one at once (it releases the Lease); no cycle's
work is done twice (the recorded cycle windows follow each other, never overlap, never run
concurrently). Real apiserver and PostgreSQL; short leases to measure the failover time.

Timing is read from the Lease itself, not from this test's polling: every version of it is
recorded from a watch, with the times the operators wrote (``renewTime`` of the holder's last
renewal, ``acquireTime`` of the successor's takeover; all processes share this machine's clock),
and from the cycles the operators recorded in the store. Each bound is what the lease settings
allow — a standby sees the holder's last renewal within one retry, waits one lease duration from
there, takes over at its next try and audits within one interval — with the retry period as the
Lease shows it was (``cadence``: the longest renewal interval, i.e. retry plus a round trip), one
audit cycle (the longest recorded: a process's own threads — informers, the scheduler, a running
cycle — hold it up about that long) and the time this machine held work back during that very
stretch (``stall``: tasks waiting for a CPU or for I/O, and hypervisor steal). On a quiet machine
the stall is near zero and the bounds are tight; on a loaded one they widen by the measured
contention, and the figures are in every assertion message.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as kube_config
from kubernetes import watch

from auditor.store import Store

pytestmark = pytest.mark.testbed

LEASE = 4.0
RENEW_DEADLINE = 3.0
RETRY = 0.5
INTERVAL = 1.0
WIDTH = timedelta(minutes=1)
#: waits that only keep a broken run from hanging (the assertions are the bounds below)
PATIENCE = 120.0


class LeaseHistory:
    """Every version of one Lease, in order, from a watch running in a thread."""

    def __init__(self, kubeconfig: str, namespace: str, name: str) -> None:
        self.api = kube_config.new_client_from_config(config_file=kubeconfig)
        self.namespace, self.name = namespace, name
        self.versions: list[dict] = []
        self.gaps = 0  # watch restarts that had to re-list (history may miss versions there)
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        leases = k8s.CoordinationV1Api(self.api)
        rv: str | None = None
        while not self._stop.is_set():
            try:
                for ev in watch.Watch().stream(
                    leases.list_namespaced_lease,
                    self.namespace,
                    field_selector=f"metadata.name={self.name}",
                    resource_version=rv,
                    timeout_seconds=5,
                ):
                    obj = ev["object"]
                    rv = obj.metadata.resource_version
                    if ev["type"] == "DELETED" or rv in self._seen:
                        continue
                    s = obj.spec
                    with self._lock:
                        self._seen.add(rv)
                        self.versions.append(
                            {
                                "holder": s.holder_identity or None,
                                "acquired": s.acquire_time,
                                "renewed": s.renew_time,
                                "transitions": s.lease_transitions or 0,
                            }
                        )
                    if self._stop.is_set():
                        return
            except k8s.ApiException as exc:
                if exc.status == 410:  # too old to resume from: re-list, versions may be missing
                    with self._lock:
                        rv, self.gaps = None, self.gaps + 1
                time.sleep(0.1)
            except Exception:  # noqa: BLE001 - a dropped connection: resume from the last version
                time.sleep(0.1)

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.versions)

    def holder(self) -> str | None:
        v = self.snapshot()
        return v[-1]["holder"] if v else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.api.close()


def _stalled() -> float:
    """Seconds so far that this machine held runnable work back: some task waiting for a CPU or
    for I/O (PSI, /proc/pressure; 0 where the kernel has none) plus CPU time the hypervisor took
    from the VM (steal, all CPUs). Any one task's delay from contention over a stretch of time is
    at most what this grows by over that stretch."""
    total = 0.0
    for resource in ("cpu", "io"):
        try:
            some = Path(f"/proc/pressure/{resource}").read_text().splitlines()[0]  # some avg10=… total=<µs>
            total += int(some.rsplit("total=", 1)[1]) / 1e6
        except (OSError, IndexError, ValueError):
            pass
    cpu = (
        Path("/proc/stat").read_text().split("\n", 1)[0].split()
    )  # cpu user nice system idle iowait irq softirq steal …
    return total + int(cpu[8]) / os.sysconf("SC_CLK_TCK")


class StallClock:
    """:func:`_stalled` sampled every 0.1 s in a thread, so it can be read for any past stretch."""

    def __init__(self) -> None:
        self.samples: list[tuple[datetime, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-clock", daemon=True)
        self._sample()
        self._thread.start()

    def _sample(self) -> None:
        self.samples.append((datetime.now(timezone.utc), _stalled()))

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def between(self, start: datetime, end: datetime) -> float:
        """The stall over the samples enclosing ``start``…``end`` (a little more, never less)."""
        before = [v for t, v in self.samples if t <= start] or [self.samples[0][1]]
        after = [v for t, v in self.samples if t >= end] or [self.samples[-1][1]]
        return after[0] - before[-1]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sample()


def _wait_for(pred, timeout: float = PATIENCE, step: float = 0.05) -> float:
    """Seconds until ``pred()`` held."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)
    return time.monotonic() - t0


def _start(cfg: Path, identity: str, log: Path) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("gpu-auditor")
    env = {**os.environ, "GPU_AUDITOR_LEADER_ELECTION__IDENTITY": identity}
    return subprocess.Popen(
        [str(exe), "-v", "run", "--config", str(cfg)],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _readyz(log: Path) -> str | None:
    """The operator's /readyz answer (None until it serves one)."""
    m = re.search(r"on port (\d+)", log.read_text(errors="replace"))
    if not m:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/readyz", timeout=5) as r:
            return r.read().decode().strip()
    except OSError:
        return None


def _takeover(versions: list[dict], old: str, new: str) -> tuple[dict, dict]:
    """The last version ``old`` wrote and the first one ``new`` wrote."""
    last_old = max(i for i, v in enumerate(versions) if v["holder"] == old)
    first_new = min(i for i, v in enumerate(versions) if v["holder"] == new)
    assert first_new > last_old, versions
    return versions[last_old], versions[first_new]


def _changes(seq: list) -> list:
    """``seq`` without repeats in a row: [a, a, b, b, a] → [a, b, a]."""
    return [x for i, x in enumerate(seq) if i == 0 or seq[i - 1] != x]


def _seconds(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def _cadence(versions: list[dict]) -> float:
    """The longest time between two renewals by the same holder: the retry period as it was."""
    gaps = [
        _seconds(a["renewed"], b["renewed"])
        for a, b in zip(versions, versions[1:])
        if a["holder"] and a["holder"] == b["holder"]
    ]
    return max([RETRY, *gaps])


def test_two_operators_one_leader_failover(testbed, namespace, prometheus, postgres_url, tmp_path):
    lease = f"lease-{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "settings.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "cluster": f"failover-{namespace}",
                "kubernetes": {"kubeconfig": testbed.kubeconfig},
                "prometheus": {
                    "url": prometheus.url,
                    "matchers": {"case": f"none-{uuid.uuid4().hex}"},
                    "label_convention": "pod",
                },
                "store": {"url": postgres_url},
                "interval": f"{INTERVAL:.0f}s",
                "bucket_width": "1m",
                "leader_election": {
                    "namespace": namespace,
                    "lease_name": lease,
                    "lease_duration": f"{LEASE:.0f}s",
                    "renew_deadline": f"{RENEW_DEADLINE:.0f}s",
                    "retry_period": f"{RETRY}s",
                },
                "features": {"kueue": False},
                "http": {"port": 0},
            }
        )
    )
    logs = {name: tmp_path / f"{name}.log" for name in "abc"}
    history = LeaseHistory(testbed.kubeconfig, namespace, lease)
    stall = StallClock()
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["a"] = _start(cfg, "op-a", logs["a"])
        _wait_for(lambda: history.holder() == "op-a")
        procs["b"] = _start(cfg, "op-b", logs["b"])
        startup = [_wait_for(lambda: _readyz(logs["b"]) == "standby")]
        time.sleep(LEASE)  # B stands by for a whole lease duration; A keeps the Lease and audits
        assert history.holder() == "op-a"

        # crash the leader: no release, B must wait for the lease to expire
        os.killpg(procs["a"].pid, signal.SIGKILL)
        procs["a"].wait(10)
        _wait_for(lambda: history.holder() == "op-b")

        # a clean stop: B releases the Lease, C takes over at its next try
        procs["c"] = _start(cfg, "op-c", logs["c"])
        startup.append(_wait_for(lambda: _readyz(logs["c"]) == "standby"))
        time.sleep(LEASE)
        assert history.holder() == "op-b"
        term = datetime.now(timezone.utc)
        os.killpg(procs["b"].pid, signal.SIGTERM)
        _wait_for(lambda: history.holder() == "op-c")
        assert procs["b"].wait(PATIENCE) == 0
        time.sleep(3)
        os.killpg(procs["c"].pid, signal.SIGTERM)
        assert procs["c"].wait(PATIENCE) == 0
        _wait_for(lambda: history.holder() is None)  # released on the clean shutdown
    except BaseException:
        for name, log in logs.items():
            if log.exists():
                print(f"----- operator {name} -----\n{log.read_text(errors='replace')[-4000:]}")
        raise
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        history.close()
        stall.close()
    versions = history.snapshot()

    with Store.open(postgres_url) as store:
        runs = [r for r in store.runs(limit=1000) if (r["detail"] or {}).get("origin") == "operator"]
    runs.sort(key=lambda r: r["started"])
    cycle = max((r["finished"] - r["started"]).total_seconds() for r in runs)
    cadence = _cadence(versions)
    figures = (
        f"{len(versions)} Lease versions, longest renewal interval {cadence:.2f} s, longest cycle "
        f"{cycle:.2f} s, standby start-ups {' and '.join(f'{t:.1f}' for t in startup)} s"
    )

    # the Lease went a → b → (released) → c → (released), never back
    assert history.gaps == 0, "the Lease watch had to re-list: versions may be missing"
    assert _changes([v["holder"] for v in versions]) == ["op-a", "op-b", None, "op-c", None], versions
    a_last, b_first = _takeover(versions, "op-a", "op-b")
    b_last, c_first = _takeover(versions, "op-b", "op-c")
    assert (
        b_first["transitions"] == a_last["transitions"] + 1 and c_first["transitions"] == b_last["transitions"] + 1
    ), versions
    released = next(v for v in versions if v["holder"] is None and v["renewed"] >= b_last["renewed"])

    # only the leader audits: every cycle began while its operator held the Lease, and
    # leadership moved a → b → c, never back, never interleaved
    terms = {
        "op-a": (a_last["acquired"], a_last["renewed"] + timedelta(seconds=RENEW_DEADLINE)),
        "op-b": (b_first["acquired"], released["renewed"]),
        "op-c": (c_first["acquired"], versions[-1]["renewed"]),
    }
    assert _changes([r["detail"]["holder"] for r in runs]) == ["op-a", "op-b", "op-c"], runs
    for r in runs:
        start, end = terms[r["detail"]["holder"]]
        assert start <= r["started"] <= end, (r, terms)
    first_audit = {h: min(r["started"] for r in runs if r["detail"]["holder"] == h) for h in ("op-b", "op-c")}

    # a crash: B waited for A's lease to expire (about one lease duration after A's last renewal),
    # then took the Lease at its next try and audited
    crash = _seconds(a_last["renewed"], b_first["acquired"])
    crash_audit = _seconds(a_last["renewed"], first_audit["op-b"])
    crash_stall = stall.between(a_last["renewed"], first_audit["op-b"])
    crash_bound = LEASE + 2 * cadence + cycle + crash_stall
    why = (
        f"lease {LEASE} s + 2 retries of {cadence:.2f} s + one cycle ({cycle:.2f} s) + {crash_stall:.2f} s of "
        f"measured stall = {crash_bound:.2f} s, one interval ({INTERVAL} s) more to audit; {figures}"
    )
    assert LEASE - cadence < crash <= crash_bound, (
        f"B took the Lease {crash:.2f} s after crashed A's last renewal; allowed: more than lease - one retry "
        f"(B may have begun the try that saw that renewal just before it was written), at most {why}"
    )
    assert crash_audit <= crash_bound + INTERVAL, (
        f"B audited {crash_audit:.2f} s after A's last renewal; allowed: {why}"
    )

    # a clean stop: B finished its running cycle and released the Lease (holder cleared); C took
    # it at its next try, without waiting for it to expire, and audited
    handover = _seconds(released["renewed"], c_first["acquired"])
    stop = _seconds(term, c_first["acquired"])
    stop_audit = _seconds(term, first_audit["op-c"])
    stop_stall = stall.between(term, first_audit["op-c"])
    assert handover <= cadence + cycle + stop_stall, (
        f"C took the released Lease {handover:.2f} s after the release; allowed: one retry of {cadence:.2f} s "
        f"+ one cycle ({cycle:.2f} s) + {stop_stall:.2f} s of measured stall; {figures}"
    )
    stop_bound = 3 * cadence + 2 * cycle + stop_stall
    why = (
        f"stopping B's elector, releasing and C's next try (3 retries of {cadence:.2f} s) + B's running cycle "
        f"and one more ({cycle:.2f} s each) + {stop_stall:.2f} s of measured stall = {stop_bound:.2f} s, "
        f"one interval ({INTERVAL} s) more to audit; {figures}"
    )
    assert stop <= stop_bound, f"C took the Lease {stop:.2f} s after SIGTERM to B; allowed: {why}"
    assert stop_audit <= stop_bound + INTERVAL, f"C audited {stop_audit:.2f} s after SIGTERM to B; allowed: {why}"
    print(
        f"failover after a crash: Lease taken {crash:.2f} s, audit {crash_audit:.2f} s after the last renewal "
        f"(bound {crash_bound:.2f} s, stall {crash_stall:.2f} s); after a clean stop: Lease taken {stop:.2f} s, "
        f"audit {stop_audit:.2f} s after SIGTERM, {handover:.2f} s after the release "
        f"(bound {stop_bound:.2f} s, stall {stop_stall:.2f} s); {figures}"
    )

    # no cycle's work done twice
    for prev, cur in zip(runs, runs[1:]):
        assert cur["started"] >= prev["finished"], "two cycles ran at the same time"
        # each window starts at the previous one's end, aligned down to its open bucket: no
        # work done twice beyond re-reading that one (idempotently replaced) bucket
        step = WIDTH.total_seconds()
        aligned = prev["window_end"].timestamp() // step * step
        assert cur["window_start"].timestamp() >= aligned, (prev, cur)
        assert all(r["status"].startswith("ok") for r in (prev, cur))
