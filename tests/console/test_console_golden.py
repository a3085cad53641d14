"""The console's pages that show the MFU (issue 28), byte for byte: the cluster, the teams and the
founding-case-like job of the demo store (``llm-pretrain-naive-attn``: its class reference, its
gap, the gauge), each compared with its file under ``tests/golden/page/`` (rewritten with
``GPU_AUDITOR_UPDATE_GOLDEN=1``, see tests/golden/README.md).

Read-only pages (a page with writes on carries a per-process form token), at the console data's
fixed ``NOW``, on a store of their own filled as the session's (tests/console/data.py): the other
console tests write acknowledgements into theirs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from auditor import compose
from auditor.settings import Settings
from auditor.store import Store
from tests.console.data import CLUSTER, NOW, fill
from tests.golden.test_golden import check


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store.open(f"sqlite:///{tmp_path_factory.mktemp('console-golden') / 'store.db'}")
    try:
        fill(s)
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
