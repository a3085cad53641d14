"""The console's job page offers the alert's two actions with the alert's words (issue 30):
"Snooze this job's escalation for 24 h" records a job snooze (who, when, until) that the page then
shows, and "Acknowledge for re-submission (gate)" stays the lineage's acknowledgement."""

from __future__ import annotations

import html
from datetime import timedelta
from pathlib import Path

from auditor import compose
from auditor.core.identity import JobKey
from auditor.settings import Settings
from auditor.store import Store
from tests.console.conftest import serve
from tests.console.data import CLUSTER, FINETUNE, NOW, fill
from tests.console.test_console_pages import get, post


def test_the_job_page_snoozes_the_jobs_escalation_and_shows_it(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    try:
        job_id = fill(store)["finetune"]
        app = compose.console(Settings(cluster="demo"), store, lambda: NOW, writes=True)
        with serve(app) as url:
            user = {"X-Forwarded-User": "alice"}
            status, page = get(f"{url}/jobs/{job_id}", user)
            page = html.unescape(page)
            assert status == 200 and "Snooze this job's escalation for 24 h" in page
            assert "Escalation snoozed" not in page
            form = {"csrf": app.token("alice"), "job": str(job_id), "kind": "job-snooze", "reason": "fixing it"}
            status, location, _ = post(url + "/ack", form, user)
            assert status == 303 and location.endswith(f"/console/jobs/{job_id}")
            key = JobKey(CLUSTER, *FINETUNE)
            assert list(store.job_snoozes().in_force(NOW)) == [key]
            [s] = store.job_snoozes().of_job(key)
            assert (s.by, s.via, s.at, s.until, s.reason) == (
                "alice",
                "console",
                NOW,
                NOW + timedelta(hours=24),
                "fixing it",
            )
            _, page = get(f"{url}/jobs/{job_id}", user)
            assert "Escalation snoozed until 2026-11-26T" in html.unescape(page) and "by alice (fixing it)" in page
            # another user's token is refused, and nothing more is recorded
            status, _, _ = post(url + "/ack", {**form, "csrf": app.token("mallory")}, user)
            assert status == 403 and len(store.job_snoozes().of_job(key)) == 1
        read_only = compose.console(Settings(cluster="demo"), store, lambda: NOW, writes=False)
        with serve(read_only) as url:
            _, page = get(f"{url}/jobs/{job_id}")
            assert "Escalation snoozed until" in page and "job-snooze-button" not in page
    finally:
        store.close()
