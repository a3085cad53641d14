"""Issue 28 item 5: the agent serves every metric at every scrape, the last computed value between computations.

NVML GPM's GR_ENGINE_ACTIVE costs ~1 ms of CPU, so the agent computes it every 10 s
(``--gr-engine-interval``) while Prometheus typically scrapes every 5 s. Served as a mean of the
ticks since the previous scrape, it was present at every other scrape only: Prometheus wrote a
staleness marker each time it went missing, and instant queries and ``absent()`` alerts flickered.
An exporter serves its last value at every scrape; these tests hold the agent to that, the last
one the way Prometheus itself scrapes it.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.agent.recorded import RecordedSampler, trace_rows
from auditor.agent.sampler import Device
from auditor.agent.server import Agent
from auditor.agent.window import SampleWindow, Tick
from auditor.traces import fake_uuid, load_trace

GR = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
SM = "DCGM_FI_PROF_SM_ACTIVE"
NODE = "h200-node-3"


def _rows() -> list[dict[str, float]]:
    """Real H200 rows of a busy phase whose GR_ENGINE_ACTIVE is well above 0."""
    return trace_rows(load_trace("h200-microbench"), "bf16_matmul")


def test_a_field_computed_every_tenth_tick_is_in_every_window_with_its_last_value():
    w = SampleWindow(first_window=5, hold=11.0)
    for t in range(1, 41):
        vals = {"X": 1.0}
        if t % 10 == 0:
            vals["GR"] = t / 100.0
        w.add(Tick(float(t), {"G": (None, vals)}))
        if t % 5 == 0 and t >= 10:
            means, _ = w.take("prom", t + 0.1)
            # the computation of this window, else the last one before it
            assert means[("G", None)]["GR"].value == pytest.approx((t - t % 10) / 100.0), t


def test_a_held_value_expires_rather_than_go_stale():
    w = SampleWindow(first_window=5, hold=11.0)
    w.add(Tick(10.0, {"G": (None, {"X": 1.0, "GR": 0.5})}))
    for t in range(11, 22):
        w.add(Tick(float(t), {"G": (None, {"X": 1.0})}))
    assert w.take("a", 21.5)[0][("G", None)]["GR"].value == 0.5  # 11 s after its computation: held
    for t in range(22, 30):
        w.add(Tick(float(t), {"G": (None, {"X": 1.0})}))
    assert "GR" not in w.take("a", 29.5)[0][("G", None)]  # the source stopped computing it: absent
    assert "GR" not in SampleWindow(first_window=5).take("c", 1.0)[0].get(("G", None), {})


def test_the_agent_holds_a_slow_field_one_computation_period_by_default():
    dev = Device(0, fake_uuid(NODE, 0), "NVIDIA H200")
    now = [1000.0]
    agent = Agent(
        RecordedSampler([dev], {dev.key: _rows()}, computed_every=10),
        node_name=NODE,
        interval=1.0,
        clock=lambda: now[0],
    )
    assert agent.window.hold == pytest.approx(11.0)
    served = []
    for i in range(1, 61):
        now[0] = 1000.0 + i
        agent.tick()
        if i % 5 == 0:
            body, _ = agent.render("prometheus")
            names = {s.name for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}
            served.append(GR in names and SM in names)
    assert all(served[1:]), served  # every scrape after the first computation (tick 10)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.testbed
def test_prometheus_scraping_every_5s_never_loses_the_slow_series(scraping_prometheus):
    """Two agents replay the same GPU with GR_ENGINE_ACTIVE computed every 10 s: one as served
    now, one with holding turned off (the old behaviour). A real Prometheus scrapes both every
    5 s; at each second of the window an instant query must find the now-agent's series, while
    the old one's comes and goes (which proves the test can see the fault)."""
    agents = []
    for i, hold in enumerate((None, 0.0)):
        dev = Device(0, fake_uuid(f"{NODE}-{i}", 0), "NVIDIA H200", "00000000:19:00.0")
        agent = Agent(
            RecordedSampler([dev], {dev.key: _rows()}, computed_every=10),
            node_name=f"{NODE}-{i}",
            interval=1.0,
            hold=hold,
        )
        agent.start()
        agents.append(agent)
    try:
        targets = ["%s:%d" % a.serve("127.0.0.1", 0) for a in agents]
        url = scraping_prometheus(*targets, interval="5s")
        start = float(math.ceil(time.time() + 15))  # past GR's first computation (tick 10) and the first scrapes
        end = start + 40
        time.sleep(max(0.0, end + 1 - time.time()))

        def present(name: str, host: str) -> list[bool]:
            q = urllib.parse.quote(f'{name}{{Hostname="{host}"}}')
            res = _get(f"{url}/api/v1/query_range?query={q}&start={start}&end={end}&step=1")["data"]["result"]
            stamps = {float(t) for r in res for t, _ in r["values"]}
            return [start + k in stamps for k in range(int(end - start) + 1)]

        now_gr, old_gr = present(GR, f"{NODE}-0"), present(GR, f"{NODE}-1")
        assert all(present(SM, f"{NODE}-0")) and all(present(SM, f"{NODE}-1"))
        assert all(now_gr), f"GR_ENGINE_ACTIVE missing at {now_gr.count(False)} of {len(now_gr)} s"
        assert old_gr.count(False) >= 10, "without holding the series should come and go"
        # absent() alerts stay quiet
        q = urllib.parse.quote(f'absent({GR}{{Hostname="{NODE}-0"}})')
        assert _get(f"{url}/api/v1/query_range?query={q}&start={start}&end={end}&step=1")["data"]["result"] == []
    finally:
        for a in agents:
            a.stop()
