"""The Lease elector on a fake clock: renew, expire, take over and give up, without waiting.

The elector reads every time through its :class:`~auditor.ports.Clock` (issue 13: before, it read
``time.monotonic``/``datetime.now`` itself, so its rules could be tested only in real time, and
slowly: test_leader_failover.py waits out real 4 s leases). Here three electors with clocks of
their own — each candidate judges expiry by its own clock, never by comparing clocks — write a
real Lease on the test bed's apiserver; a whole 15 s term runs in milliseconds.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from fake_clock import START, FakeClock

from auditor.kube.client import call_json
from auditor.kube.lease import LeaderElector

pytestmark = pytest.mark.testbed

LEASE, RENEW, RETRY = 15.0, 10.0, 2.0


def _elector(api, namespace: str, name: str, identity: str, clock: FakeClock, events: list[str]) -> LeaderElector:
    return LeaderElector(
        api,
        namespace=namespace,
        name=name,
        identity=identity,
        lease_duration=timedelta(seconds=LEASE),
        renew_deadline=timedelta(seconds=RENEW),
        retry_period=timedelta(seconds=RETRY),
        on_stopped=lambda: events.append(f"{identity} stopped"),
        clock=clock,
    )


def _spec(api, namespace: str, name: str) -> dict:
    return call_json(api, f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")["spec"]


def test_renew_expire_and_takeover_by_each_candidates_own_clock(kube_admin, namespace):
    t0 = time.monotonic()
    name = f"lease-{uuid.uuid4().hex[:6]}"
    events: list[str] = []
    ca, cb = FakeClock(), FakeClock(START + timedelta(hours=3))  # the machines' clocks disagree
    a = _elector(kube_admin, namespace, name, "a", ca, events)
    b = _elector(kube_admin, namespace, name, "b", cb, events)

    assert a.try_acquire_or_renew() and a.is_leader
    spec = _spec(kube_admin, namespace, name)
    assert spec["holderIdentity"] == "a" and spec["renewTime"] == "2026-03-02T09:00:00.000000Z"
    assert not b.try_acquire_or_renew() and b.holder() == "a"

    # a renews every retry period: b, seeing the record change, never takes over
    for _ in range(10):
        ca.advance(RETRY)
        cb.advance(RETRY)
        assert a.try_acquire_or_renew() and a.is_leader
        assert not b.try_acquire_or_renew()
    assert _spec(kube_admin, namespace, name)["renewTime"] == "2026-03-02T09:00:20.000000Z"  # a's clock

    # a stops renewing: past the renew deadline it no longer leads, by its own clock ...
    ca.advance(RENEW - 0.5)
    assert a.is_leader
    ca.advance(1.0)
    assert not a.is_leader and not a.ensure_leader()
    # ... and b takes over only a whole lease duration after it last saw the record change
    cb.advance(LEASE - 0.5)
    assert not b.try_acquire_or_renew() and b.holder() == "a"
    cb.advance(1.0)
    assert b.try_acquire_or_renew() and b.is_leader
    spec = _spec(kube_admin, namespace, name)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert spec["acquireTime"] == spec["renewTime"] == "2026-03-02T12:00:35.500000Z"  # b's clock

    # a, back, finds b holding: it steps down (on_stopped) and does not write
    assert not a.try_acquire_or_renew() and not a.is_leader and events == ["a stopped"]
    assert _spec(kube_admin, namespace, name)["holderIdentity"] == "b"
    assert time.monotonic() - t0 < 10  # 30+ simulated seconds of lease rules, on a real apiserver


def test_acquire_gives_up_after_its_timeout_then_wins_a_released_lease_at_once(kube_admin, namespace):
    name = f"lease-{uuid.uuid4().hex[:6]}"
    events: list[str] = []
    ch, cc = FakeClock(), FakeClock()
    holder = _elector(kube_admin, namespace, name, "holder", ch, events)
    candidate = _elector(kube_admin, namespace, name, "candidate", cc, events)
    assert holder.try_acquire_or_renew()

    def holder_renews(seconds: float) -> None:  # the holder's renew loop, while the candidate waits
        ch.advance(seconds)
        assert holder.try_acquire_or_renew()

    cc.meanwhile = holder_renews
    t0 = time.monotonic()
    # run --once's wait: one lease duration plus two retries, tried every retry period
    assert candidate.acquire(timeout=LEASE + 2 * RETRY) is False
    assert time.monotonic() - t0 < 5, "the waits were simulated, not slept"
    assert cc.monotonic() == pytest.approx(LEASE + 2 * RETRY)
    assert cc.waits == [RETRY] * 9 + [pytest.approx(1.0)]  # cut at the deadline, never past it
    assert candidate.holder() == "holder"

    # a clean shutdown releases: the candidate takes over at its next try, not after a lease duration
    cc.meanwhile = None
    assert holder.release() and events == ["holder stopped"]
    assert _spec(kube_admin, namespace, name).get("holderIdentity") is None
    cc.waits.clear()
    assert candidate.acquire(timeout=LEASE) and cc.waits == []
    assert _spec(kube_admin, namespace, name)["holderIdentity"] == "candidate"


def test_a_leader_cut_off_from_the_apiserver_steps_down_at_the_renew_deadline(kube_admin, namespace):
    """Its renewals fail (a network partition): at the renew deadline it stops leading and says so
    (``on_stopped``: the leader gauge drops, the gate stops), before anyone may take over."""
    from kubernetes import client as k8s

    name = f"lease-{uuid.uuid4().hex[:6]}"
    events: list[str] = []
    clock = FakeClock()
    a = _elector(kube_admin, namespace, name, "a", clock, events)
    assert a.try_acquire_or_renew()
    cut_off = k8s.Configuration()
    cut_off.host = "http://127.0.0.1:9"  # nothing listens: every renewal fails at once
    a.api = k8s.ApiClient(cut_off)
    stopped_at: list[float] = []
    a.on_stopped = lambda: stopped_at.append(clock.monotonic())
    clock.meanwhile = lambda _s: a._stop.set() if clock.monotonic() >= 2 * LEASE else None
    a._run()  # the elector thread's loop, on this thread: its waits advance the fake clock
    assert not a.is_leader
    assert stopped_at == [pytest.approx(RENEW)], (stopped_at, a.last_error)
