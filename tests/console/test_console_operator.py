"""The operator serves the console on its own HTTP server (console.enabled, console.writes), next
to /metrics; with the console off, /console is not found. The operator runs against the test
bed's apiserver (its informers sync there)."""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from datetime import timedelta

import kubernetes.client as k8s
from operator_settings import operator_settings

from auditor.core.gate import LineageRun
from auditor.core.lineage import LineageKey
from auditor.core.model import JobRef
from auditor.operator_loop.service import Operator
from auditor.store import Store
from auditor.store.lineage import AckLog, LineageRecorder
from tests.console.data import NOW

KEY = LineageKey("east", "ml", "train")


def operator(tmp_path, api: k8s.ApiClient, *, start: bool = True, **console: bool) -> Operator:
    tmp_path.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{tmp_path}/store.db"
    settings = operator_settings(
        tmp_path, cluster="east", store={"url": url}, prometheus={"url": "http://127.0.0.1:9"}, console=console
    )
    store = Store.open(url)
    jid = store.upsert_job(JobRef("east", "ml", "Job", "train", uid="u1", team="ml"), NOW - timedelta(hours=2), NOW)
    store.save_summary(
        jid,
        {"cluster": "east", "namespace": "ml", "job": "Job/train", "team": "ml", "verdict": "idle", "findings": []},
    )
    LineageRecorder(store).record(KEY, LineageRun("Job/train", "idle", start=NOW - timedelta(hours=2)), NOW, team="ml")
    op = Operator(settings, store=store, api=api, clock=lambda: NOW)
    if start:
        op.start(http=True, sync_timeout=30)
    return op


def fetch(url: str, form: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers or {}), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_operator_serves_the_console_and_records_an_ack(tmp_path, kube_admin: k8s.ApiClient) -> None:
    op = operator(tmp_path, kube_admin, writes=True)
    try:
        assert op.health is not None
        base = f"http://127.0.0.1:{op.health.port}"
        status, page = fetch(f"{base}/console/jobs")
        assert status == 200 and "ml/Job/train" in page and "writes enabled" in page
        job = re.search(r'href="/console/jobs/(\d+)"', page).group(1)  # type: ignore[union-attr]
        _, page = fetch(f"{base}/console/jobs/{job}", headers={"X-Forwarded-User": "erin"})
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)  # type: ignore[union-attr]
        form = {"csrf": token, "lineage": "ml/train", "cluster": "east", "kind": "ack", "until": "", "job": job}
        status, page = fetch(f"{base}/console/ack", form, {"X-Forwarded-User": "erin"})
        assert status == 200 and "erin" in page  # followed the redirect back to the job page
        assert [(a.by, a.via, a.until) for a in AckLog(op.store).acks(KEY)] == [("erin", "console", None)]
        assert fetch(f"{base}/metrics")[0] == 200
    finally:
        op.shutdown()


def test_the_console_can_be_switched_off_and_is_read_only_by_default(tmp_path) -> None:
    """Without starting (no informers): what the operator would mount."""
    for console, expected in (({"enabled": False}, None), ({}, False), ({"writes": True}, True)):
        op = operator(tmp_path / str(len(console)) / str(expected), k8s.ApiClient(), start=False, **console)
        try:
            mounts = op._console_mounts()
            if expected is None:
                assert mounts == {}
            else:
                (mount,) = mounts.values()
                assert mount.__self__.config.writes is expected  # type: ignore[attr-defined]
        finally:
            op.store.close()
