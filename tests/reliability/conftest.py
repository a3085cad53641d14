"""The fault-and-abuse suite's harness: the ``fault_proxy`` and ``receiver`` fixtures, and the
summary line ``reliability: N tried, N held`` printed at the end of every run that includes it.

Every test under tests/reliability/ is marked ``reliability`` (as is any test elsewhere that
carries the mark); the summary counts them: *tried* is every such test run, *held* those that
passed. docs/reliability.md records the count and which probe each test keeps.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterator

import pytest
from faultproxy import FaultProxy

HERE = Path(__file__).parent
# the local Slack/webhook receiver the policy tests use (a real http.server on 127.0.0.1)
sys.path.insert(0, str(HERE.parent / "policy"))
from policy_receivers import Receiver  # noqa: E402

ROOT_PREFIX = "tests/reliability/"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.reliability)


@pytest.fixture
def fault_proxy() -> Iterator[Callable[[str], FaultProxy]]:
    """``fault_proxy(upstream_url)`` → a :class:`FaultProxy` in front of it (closed at teardown)."""
    made: list[FaultProxy] = []

    def make(upstream: str) -> FaultProxy:
        p = FaultProxy(upstream)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real local HTTP receiver standing in for Slack or a webhook (records every POST)."""
    r = Receiver()
    yield r
    r.close()


def _is_reliability(report: pytest.TestReport) -> bool:
    return report.nodeid.startswith(ROOT_PREFIX) or "reliability" in report.keywords


def tally(reports: list[pytest.TestReport]) -> dict[str, bool]:
    """nodeid → held: a test holds when its call passed and no phase failed (a skip or an
    expected failure never holds: the suite has neither)."""
    seen: dict[str, bool] = {}
    for r in reports:
        if not _is_reliability(r):
            continue
        bad = r.failed or r.skipped or hasattr(r, "wasxfail")
        if r.when == "call" or bad:
            seen[r.nodeid] = seen.get(r.nodeid, True) and not bad
    return seen


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    reports = [r for rs in terminalreporter.stats.values() for r in rs if isinstance(r, pytest.TestReport)]
    held = tally(reports)
    if not held:
        return
    per_file: dict[str, list[bool]] = defaultdict(list)
    for nodeid, ok in held.items():
        per_file[nodeid.split("::")[0]].append(ok)
    tw = terminalreporter
    tw.section("reliability")
    for f, oks in sorted(per_file.items()):
        tw.write_line(f"  {f:<60} {len(oks):>3} tried {sum(oks):>3} held")
    for nodeid, ok in sorted(held.items()):
        if not ok:
            tw.write_line(f"  not held: {nodeid}")
    tw.write_line(f"reliability: {len(held)} tried, {sum(held.values())} held")
