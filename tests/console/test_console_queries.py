"""The console's store queries on SQLite and the test bed's PostgreSQL: the job list's filters,
sorts (missing values last, either direction), pages and LIKE wildcards taken literally."""

from __future__ import annotations

from datetime import timedelta

import pytest

from auditor.console.ports import JobFilter
from auditor.core.model import JobRef
from auditor.store import Store
from auditor.store.console_queries import ConsoleQueries
from tests.console.data import NOW


@pytest.fixture
def queries(store_url: str):
    store = Store.open(store_url)
    for i in range(30):
        team = ("vision", "llm", "research")[i % 3]
        name = "train_50%" if i == 7 else f"job-{i:02d}"
        ended = None if i % 2 else NOW - timedelta(hours=1)
        jid = store.upsert_job(
            JobRef("c1", f"ns-{team}", "Job", name, uid=f"u{i}", team=team), NOW - timedelta(hours=3), NOW
        )
        if ended is not None:
            store.set_job_ended(jid, ended)
        store.save_summary(
            jid,
            {
                "cluster": "c1",
                "namespace": f"ns-{team}",
                "job": f"Job/{name}",
                "team": team,
                "verdict": "idle" if i % 5 == 0 else "healthy",
                "start": (NOW - timedelta(hours=3, minutes=i)).isoformat().replace("+00:00", "Z"),
                "end": (NOW - timedelta(minutes=i)).isoformat().replace("+00:00", "Z"),
                "gpu_hours": float(i),
                "waste_gpu_hours": None if i == 3 else float(30 - i) / 2,
                "sm_active": 0.5,
                "findings": [],
            },
        )
    yield ConsoleQueries(store)
    store.close()


def test_job_list_filters_sorts_and_pages_in_the_database(queries: ConsoleQueries) -> None:
    page = queries.jobs(JobFilter(limit=5))
    assert page.total == 30 and len(page.rows) == 5
    assert [r.waste_gpu_hours for r in page.rows] == [15.0, 14.5, 14.0, 13.0, 12.5]  # job 3 has none
    assert page.teams == ["llm", "research", "vision"] and page.verdicts == ["healthy", "idle"]

    last = queries.jobs(JobFilter(sort="waste_gpu_hours", descending=False, offset=25, limit=10))
    assert [r.waste_gpu_hours for r in last.rows][-1] is None  # missing values last, ascending too

    llm_idle = queries.jobs(JobFilter(team="llm", verdict="idle"))
    assert {(r.team, r.verdict) for r in llm_idle.rows} == {("llm", "idle")} and llm_idle.total == 2

    running = queries.jobs(JobFilter(state="running", namespace="ns-llm", sort="job", descending=False))
    assert [r.name for r in running.rows] == ["job-01", "job-13", "job-19", "job-25", "train_50%"]
    assert all(r.running for r in running.rows) and running.rows[0].start is not None
    assert running.rows[0].start.tzinfo is not None

    assert [r.name for r in queries.jobs(JobFilter(text="50%")).rows] == ["train_50%"]
    assert queries.jobs(JobFilter(text="_5")).total == 1  # "_" is a character, not a wildcard

    by_hours = queries.jobs(JobFilter(sort="gpu_hours", descending=True, limit=3))
    assert [r.gpu_hours for r in by_hours.rows] == [29.0, 28.0, 27.0]
