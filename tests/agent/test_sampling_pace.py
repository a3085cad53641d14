"""The agent's sampling loop keeps its interval, and skips ticks it fell behind on instead of
bursting them — on a fake timer (auditor.ports.Clock), so 1 s ticks run without waiting."""

from __future__ import annotations

import pytest
from fake_clock import FakeClock

from auditor.agent.recorded import RecordedSampler
from auditor.agent.sampler import Device
from auditor.agent.server import Agent


class _SlowOnce(RecordedSampler):
    """Reading the devices takes ``slow`` seconds of the fake timer at the given samples."""

    def __init__(self, timer: FakeClock, slow: dict[int, float]) -> None:
        super().__init__([Device(0, "GPU-x", "NVIDIA H200")], {"GPU-x": [{"DCGM_FI_PROF_SM_ACTIVE": 0.5}]})
        self.timer, self.slow, self.at = timer, slow, []

    def sample(self):
        self.at.append(self.timer.monotonic())
        self.timer.advance(self.slow.get(len(self.at), 0.0))
        return super().sample()


def _run(slow: dict[int, float], ticks: int) -> tuple[Agent, _SlowOnce, FakeClock]:
    timer = FakeClock()
    sampler = _SlowOnce(timer, slow)
    agent = Agent(sampler, node_name="n", interval=1.0, timer=timer)
    timer.meanwhile = lambda _s: agent.stop() if agent.samples >= ticks else None
    agent._sampling_loop()  # the sampling thread's body, on this thread
    return agent, sampler, timer


def test_ticks_keep_the_interval_however_long_a_read_takes():
    agent, sampler, timer = _run({2: 0.3, 3: 0.6}, ticks=5)
    assert agent.samples == 5
    assert sampler.at == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0])  # on the grid: a slow read shortens the next wait
    assert timer.waits == pytest.approx([1.0, 0.7, 0.4, 1.0, 1.0])


def test_a_read_longer_than_the_interval_skips_the_missed_ticks():
    agent, sampler, timer = _run({2: 2.5}, ticks=4)
    assert sampler.at == pytest.approx([0.0, 1.0, 3.5, 4.5])  # no burst of catch-up samples after the slow one
    assert timer.waits == pytest.approx([1.0, 0.0, 1.0, 1.0])
