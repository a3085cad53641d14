"""Credentials in URLs never reach a terminal, a log line or the store.

The probe: ``--prometheus http://user:pw@host`` was printed in the audit's note, CLI errors,
``doctor`` and operator logs; at ``-vv`` urllib3's debug log printed the Slack webhook's path
(the webhook's secret) and ``?token=`` query parameters. The URL's credentials now become basic
auth and leave the URL every message names; every log record, a library's too, and every CLI
error line pass the one masker (auditor/redact.py).
"""

from __future__ import annotations

import io
import logging
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from auth_proxy import AuthProxy

from auditor import redact
from auditor.notify.http import RetryPolicy
from auditor.notify.slack import SlackNotifier
from auditor.notify.webhook import WebhookNotifier
from auditor.redact import mask_text, mask_url

CLI = str(Path(sys.executable).with_name("gpu-auditor"))
SECRET = "s3cret-Pw-4711"
#: a fixed past hour: the run does not depend on the wall clock (what it finds does not matter)
RANGE = ["--start", "2026-11-30T09:00:00Z", "--end", "2026-11-30T10:00:00Z"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def basic_proxy(prometheus) -> Iterator[AuthProxy]:
    proxy = AuthProxy.basic(prometheus.url, "alice", SECRET).start()
    yield proxy
    proxy.stop()


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://alice:pw@prom:9090/x", "http://alice:***@prom:9090/x"),
        ("http://alice:p@ss@prom/", "http://alice:***@prom/"),
        ("https://hooks.slack.com/services/T0/B0/XyZ", "https://hooks.slack.com/services/***"),
        ("http://h/hook?a=1&token=abc&Api-Key=k&sig=s", "http://h/hook?a=1&token=***&Api-Key=***&sig=***"),
        ("postgresql://u@db/x?password=pw&sslmode=require", "postgresql://u@db/x?password=***&sslmode=require"),
        ("sqlite:////var/lib/x.db", "sqlite:////var/lib/x.db"),
        ("http://prom:9090", "http://prom:9090"),
    ],
)
def test_one_masker_for_every_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_free_text_and_registered_secrets_are_masked() -> None:
    line = 'failed: Prometheus at http://a:pw1@h:1 down; "POST /services/T1/B1/abc HTTP/1.1" 200; GET /q?token=t0k'
    assert (
        mask_text(line)
        == 'failed: Prometheus at http://a:***@h:1 down; "POST /services/*** HTTP/1.1" 200; GET /q?token=***'
    )
    redact.register_url("http://receiver.example/hooks/" + SECRET)
    assert mask_text(f'"POST /hooks/{SECRET} HTTP/1.1" 200') == '"POST *** HTTP/1.1" 200'


def test_audit_sends_url_credentials_as_basic_auth_and_never_prints_or_stores_them(
    basic_proxy: AuthProxy, tmp_path: Path
) -> None:
    url = basic_proxy.url.replace("http://", f"http://alice:{SECRET}@")
    db = tmp_path / "a.db"
    r = cli("-vv", "audit", "--prometheus", url, "--no-kube", *RANGE, "--db", f"sqlite:///{db}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert basic_proxy.authorized > 0 and basic_proxy.refused == 0  # the credentials still went
    assert SECRET not in r.stdout + r.stderr
    assert f"from {basic_proxy.url} in " in r.stderr
    assert "urllib3.connectionpool" in r.stderr  # -vv did log the library's requests
    assert SECRET.encode() not in db.read_bytes()


def test_doctor_never_shows_url_credentials(basic_proxy: AuthProxy) -> None:
    url = basic_proxy.url.replace("http://", f"http://alice:{SECRET}@")
    r = cli("-vv", "doctor", "--prometheus", url, "--output", "json")
    assert basic_proxy.authorized > 0 and basic_proxy.refused == 0
    assert SECRET not in r.stdout + r.stderr
    assert basic_proxy.url in r.stdout


def test_an_unreachable_prometheus_is_one_line_without_its_credentials(tmp_path: Path) -> None:
    port = closed_port()
    url = f"http://alice:{SECRET}@127.0.0.1:{port}"
    r = cli(
        "audit",
        "--prometheus",
        url,
        "--prometheus-retries",
        "0",
        "--no-kube",
        *RANGE,
        "--db",
        f"sqlite:///{tmp_path}/a.db",
    )
    assert r.returncode == 1
    assert SECRET not in r.stdout + r.stderr
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .startswith(f"gpu-auditor: failed (retryable): Prometheus at http://127.0.0.1:{port}")
    )


@pytest.fixture
def urllib3_debug() -> Iterator[io.StringIO]:
    """urllib3's debug log into a stream, through a handler of its own, formatted as the CLI's."""
    stream = io.StringIO()
    logger = logging.getLogger("urllib3")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    redact.install(logger)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(old)


def test_a_webhook_path_and_token_never_reach_the_debug_log(receiver, urllib3_debug: io.StringIO) -> None:
    base = receiver.url.rsplit("/", 1)[0]
    slack = SlackNotifier(f"{base}/services/T0AAA/B0BBB/{SECRET}")
    assert slack.send("hello").ok
    hook = WebhookNotifier(f"{base}/hook?token={SECRET}x", "signing-key-0123456789")
    assert hook.send("test", {"event": "test"}).ok
    assert [r.path for r in receiver.requests] == [f"/services/T0AAA/B0BBB/{SECRET}", f"/hook?token={SECRET}x"]
    log = urllib3_debug.getvalue()
    assert '"POST /services/*** HTTP/1.1" 200' in log and "/hook?token=*** HTTP/1.1" in log
    assert SECRET not in log


def test_a_failed_delivery_records_no_secret() -> None:
    port = closed_port()
    hook = WebhookNotifier(
        f"http://127.0.0.1:{port}/hook?token={SECRET}",
        "signing-key-0123456789",
        retry=RetryPolicy(attempts=1, timeout=2),
    )
    d = hook.send("test", {"event": "test"})
    assert not d.ok and d.error and SECRET not in d.error


def test_an_ordinary_webhook_path_is_not_taken_for_a_secret() -> None:
    redact.register_url("https://alerts.example/api/v1/alerts?token=" + SECRET)
    assert mask_text("POST /api/v1/query_range 200") == "POST /api/v1/query_range 200"
    assert mask_text(f"POST /api/v1/alerts?token={SECRET} 200") == "POST /api/v1/alerts?token=*** 200"
