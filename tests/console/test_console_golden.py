"""Every console view, byte for byte (issues 28 and 31): the cluster, the teams, the job list
(default, filtered and paged, the hostile team's), job pages (the founding-case-like
``llm-pretrain-naive-attn`` with its MFU gauge, a MIG slice, the hostile label, a job with a
snoozed escalation and writes on), the policy ladder, the gate, the deliveries and the error
pages (404, 400), each compared with its file under ``tests/golden/page/`` (rewritten with
``GPU_AUDITOR_UPDATE_GOLDEN=1``, see tests/golden/README.md). They pin the markup so that a change
of how the pages are built (f-strings to templates, issue 31) is proven byte for byte.

At the console data's fixed ``NOW``, on a store of their own filled as the session's
(tests/console/data.py): the other console tests write acknowledgements into theirs. A page with
writes on carries a per-process form token: it is replaced by a fixed one before the comparison."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest

from auditor import compose
from auditor.core.identity import JobKey
from auditor.settings import Settings
from auditor.store import Store
from tests.console.data import CLUSTER, FINETUNE, NOW, fill
from tests.golden.test_golden import check


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store.open(f"sqlite:///{tmp_path_factory.mktemp('console-golden') / 'store.db'}")
    try:
        fill(s)
        # the job page's escalation snooze (issue 30): the finetune job's ladder is paused
        s.job_snoozes().snooze(
            JobKey(CLUSTER, *FINETUNE), "kube:alice", NOW + timedelta(hours=20), "rollout", NOW - timedelta(hours=4)
        )
        yield s
    finally:
        s.close()


@pytest.mark.parametrize("page", ["", "teams", "naive-attn"])
def test_console_pages_with_mfu(store: Store, page: str) -> None:
    app = compose.console(Settings(cluster=CLUSTER), store, lambda: NOW, writes=False)
    path = page
    if page == "naive-attn":
        found = store.find_job("llm", "PyTorchJob", "llm-pretrain-naive-attn", cluster=CLUSTER)
        assert found is not None
        path = f"jobs/{found[0]}"
    r = app.handle("GET", path, "", {}, b"")
    assert r.status == 200
    check(f"page/console-{page or 'cluster'}.html", r.body.decode())


#: the form token a page with writes carries (a per-process HMAC), fixed for the comparison
_TOKEN = re.compile(r'name="csrf" value="[0-9a-f]{64}"')
#: (golden name, path, query, writes on, status); a path "job:NAMESPACE/KIND/NAME" is that job's page
VIEWS = [
    ("jobs", "jobs", "", False, 200),
    ("jobs-filtered", "jobs", "team=llm&sort=job&desc=0&limit=2&offset=1", False, 200),
    ("jobs-hostile", "jobs", "namespace=evil", False, 200),
    ("jobs-search", "jobs", "verdict=low_sm_efficiency&state=running&q=%3Cb%3Efine", False, 200),
    ("job-finetune-snoozed-writes", "job:llm/PyTorchJob/llm-finetune", "", True, 200),
    ("job-finetune-snoozed", "job:llm/PyTorchJob/llm-finetune", "", False, 200),
    ("job-mig", "job:research/Job/softmax-bench", "", False, 200),
    ("job-hostile", "job:evil/Job/label-test", "", False, 200),
    ("policy", "policy", "", False, 200),
    ("gate", "gate", "", False, 200),
    ("deliveries", "deliveries", "", False, 200),
    ("error-404", "no-such-page", "", False, 404),
    ("error-404-job", "jobs/999999", "", False, 404),
    ("error-400", "jobs", "sort=nonsense", False, 400),
]


@pytest.mark.parametrize(("name", "path", "query", "writes", "status"), VIEWS, ids=[v[0] for v in VIEWS])
def test_console_views(store: Store, name: str, path: str, query: str, writes: bool, status: int) -> None:
    app = compose.console(Settings(cluster=CLUSTER), store, lambda: NOW, writes=writes)
    if path.startswith("job:"):
        namespace, kind, job = path.removeprefix("job:").split("/")
        found = store.find_job(namespace, kind, job, cluster=CLUSTER)
        assert found is not None
        path = f"jobs/{found[0]}"
    r = app.handle("GET", path, query, {"X-Forwarded-User": "alice@example.com"}, b"")
    assert r.status == status
    check(f"page/console-{name}.html", _TOKEN.sub('name="csrf" value="TOKEN"', r.body.decode()))
