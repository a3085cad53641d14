"""The store of Kueue's admission facts per job (migration 0008), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from revisions import assert_tables_match_migrations

from auditor.core.admission import admission_facts
from auditor.core.model import JobRef
from auditor.store.admission_tables import ADMISSIONS
from auditor.store.admissions import AdmissionStore
from auditor.store.store import Store
from auditor.store.tables import JOBS


def test_admissions_table_matches_migration(store_url: str) -> None:
    Store.open(store_url).close()
    assert_tables_match_migrations(store_url, [JOBS, ADMISSIONS])  # JOBS: the table its foreign key names


# ---------------------------------------------------------------------- recording and reading

DOCS = json.loads((Path(__file__).parents[1] / "fixtures" / "kueue" / "workloads.json").read_text())
T0 = datetime(2026, 12, 1, 13, 0, tzinfo=timezone.utc)


def _job(store: Store, name: str, team: str) -> int:
    ref = JobRef(cluster="c1", namespace="ml", kind="Job", name=name, uid=f"u-{name}", team=team)
    job_id = store.upsert_job(ref, T0, T0)
    store.save_summary(
        job_id, {"cluster": "c1", "namespace": "ml", "job": f"Job/{name}", "team": team, "verdict": "healthy"}
    )
    return job_id


def test_readings_fold_into_the_stored_facts(store_url: str) -> None:
    store = Store.open(store_url)
    try:
        a = AdmissionStore(store)
        job_id = _job(store, "second", "vision")
        assert a.facts(job_id) is None
        written = [
            a.record([(job_id, admission_facts(DOCS[s]))], T0) for s in ("waited", "waited", "deactivated_later")
        ]
        assert written == [1, 0, 1]  # an unchanged reading is not rewritten
        a.record([(job_id, admission_facts(DOCS["readmitted"]))], T0)
        f = a.facts(job_id)
        assert f is not None
        assert f.cluster_queue == admission_facts(DOCS["waited"]).cluster_queue
        assert f.admitted_at == datetime(2026, 12, 1, 12, 41, 51, tzinfo=timezone.utc) and f.queue_wait_s == 3.0
        assert f.evictions == {"Deactivated": 1} and f.requeues == 1 and f.last_eviction_reason == "Deactivated"
        assert f.last_wait_s == 0.0 and not f.pending
    finally:
        store.close()


def test_week_waits_by_team(store_url: str) -> None:
    store = Store.open(store_url)
    try:
        a = AdmissionStore(store)
        first, second = _job(store, "first", "vision"), _job(store, "second", "vision")
        other = _job(store, "other", "nlp")
        a.record(
            [
                (first, admission_facts(DOCS["admitted"])),
                (second, admission_facts(DOCS["waited"])),
                (other, admission_facts(DOCS["deactivated_later"])),  # first admission never seen
            ],
            T0,
        )
        day = datetime(2026, 12, 1, tzinfo=timezone.utc)
        assert a.week_waits(day, day + timedelta(days=7)) == {"vision": [0.0, 3.0]}
        assert a.week_waits(day, day + timedelta(days=7), teams=["nlp"]) == {}
        assert a.week_waits(day + timedelta(days=1), day + timedelta(days=8), cluster="c1") == {}
    finally:
        store.close()


def test_a_deleted_job_takes_its_facts_along(store_url: str) -> None:
    store = Store.open(store_url)
    try:
        a = AdmissionStore(store)
        job_id = _job(store, "gone", "vision")
        a.record([(job_id, admission_facts(DOCS["admitted"]))], T0)
        with store.writing("delete a job") as conn:
            conn.execute(JOBS.delete().where(JOBS.c.id == job_id))  # as retention does
        assert a.facts(job_id) is None
    finally:
        store.close()
