"""The console's test store and server: built once per session (the demo cluster's audit takes
seconds), at an injected ``NOW``, served by the operator's own HTTP server with writes on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from auditor import compose
from auditor.console.app import ConsoleApp
from auditor.operator_loop.health import HealthServer, OperatorMetrics
from auditor.settings import Settings
from auditor.store import Store
from tests.console.data import NOW, fill

#: screenshots and page sources the browser tests keep (gitignored)
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"


@dataclass
class Console:
    url: str  # the console's root, e.g. http://127.0.0.1:PORT/console
    store: Store
    app: ConsoleApp
    ids: dict[str, int]


@contextmanager
def serve(app: ConsoleApp) -> Iterator[str]:
    """``app`` mounted on the operator's own HTTP server on a free port; yields its root URL."""
    server = HealthServer(
        "127.0.0.1",
        0,
        metrics=OperatorMetrics(),
        healthy=lambda: (True, ""),
        ready=lambda: (True, ""),
        mounts={app.config.base: app.mount},
    ).start()
    try:
        yield f"http://127.0.0.1:{server.port}{app.config.base}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    path = tmp_path_factory.mktemp("console") / "store.db"
    store = Store.open(f"sqlite:///{path}")
    ids = fill(store)
    app = compose.console(Settings(cluster="demo"), store, lambda: NOW, writes=True)
    try:
        with serve(app) as url:
            yield Console(url, store, app, ids)
    finally:
        store.close()
