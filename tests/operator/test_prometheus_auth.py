"""Every command that reads Prometheus honours every auth input its ``--help`` lists (issue 13).

The defect: ``gpu-auditor run`` listed ``--prometheus-user``, ``--prometheus-password-file`` and
``GPU_AUDITOR_PROMETHEUS_TOKEN`` but built its Prometheus client apart from ``audit`` and
``doctor`` and ignored them, so an operator run against a secured Prometheus failed with HTTP
401. Proven against an authenticating reverse proxy of our own (tests/auth_proxy.py) in front of
the test bed's real Prometheus, on the real apiserver: the proxy counts the requests that came
with the right credentials, so a pass means every request carried them.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from auth_proxy import AuthProxy

from auditor.cli.main import main

pytestmark = pytest.mark.testbed

USER, PASSWORD, TOKEN = "auditor", "s3cret-pw", "tok-" + "0123456789abcdef"


@pytest.fixture
def basic_proxy(prometheus):
    proxy = AuthProxy.basic(prometheus.url, USER, PASSWORD).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def bearer_proxy(prometheus):
    proxy = AuthProxy.bearer(prometheus.url, TOKEN).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("GPU_AUDITOR_PROMETHEUS_TOKEN", "GPU_AUDITOR_PROMETHEUS_PASSWORD", "GPU_AUDITOR_PROMETHEUS_URL"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _settings(testbed, tmp_path: Path) -> str:
    """A run settings file without any Prometheus: the URL and credentials come from flags/env."""
    cfg = tmp_path / f"settings-{uuid.uuid4().hex[:6]}.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "cluster": "auth",
                "kubernetes": {"kubeconfig": testbed.kubeconfig},
                "prometheus": {"matchers": {"case": f"auth{uuid.uuid4().hex[:8]}"}},
                "store": {"url": f"sqlite:///{tmp_path / 'store.db'}"},
                "policies": {"builtin": False},
                "reports": {"weekly_schedule": ""},
                "leader_election": {"enabled": False},
                "http": {"port": 0},
            }
        )
    )
    return str(cfg)


def _secret(tmp_path: Path, name: str, value: str) -> str:
    path = tmp_path / name
    path.write_text(value + "\n")
    return str(path)


def _run_once(capsys, cfg: str, url: str, *auth: str) -> tuple[int, str]:
    rc = main(["run", "--once", "--output", "json", "--config", cfg, "--prometheus", url, *auth])
    out = capsys.readouterr()
    if rc == 0:
        assert json.loads(out.out) == []  # no GPU pods of this case: an empty, successful cycle
    return rc, out.err


def test_run_once_sends_basic_auth_from_the_flags(testbed, basic_proxy, clean_env, tmp_path, capsys):
    cfg = _settings(testbed, tmp_path)
    pw = _secret(tmp_path, "pw", PASSWORD)
    rc, err = _run_once(capsys, cfg, basic_proxy.url, "--prometheus-user", USER, "--prometheus-password-file", pw)
    assert rc == 0, err
    assert basic_proxy.authorized >= 2 and basic_proxy.refused == 0  # buildinfo + the name lookup at least

    # the password from GPU_AUDITOR_PROMETHEUS_PASSWORD, as --help says
    clean_env.setenv("GPU_AUDITOR_PROMETHEUS_PASSWORD", PASSWORD)
    rc, err = _run_once(capsys, cfg, basic_proxy.url, "--prometheus-user", USER)
    assert rc == 0, err
    assert basic_proxy.refused == 0

    # a wrong password is refused by the server: exit 1, saying why
    clean_env.setenv("GPU_AUDITOR_PROMETHEUS_PASSWORD", "wrong")
    rc, err = _run_once(capsys, cfg, basic_proxy.url, "--prometheus-user", USER)
    assert rc == 1 and "refused access (HTTP 401)" in err, err


def test_run_once_sends_the_bearer_token_from_env_or_file(testbed, bearer_proxy, clean_env, tmp_path, capsys):
    cfg = _settings(testbed, tmp_path)
    clean_env.setenv("GPU_AUDITOR_PROMETHEUS_TOKEN", TOKEN)
    rc, err = _run_once(capsys, cfg, bearer_proxy.url)
    assert rc == 0, err
    assert bearer_proxy.authorized >= 2 and bearer_proxy.refused == 0

    clean_env.delenv("GPU_AUDITOR_PROMETHEUS_TOKEN")
    rc, err = _run_once(capsys, cfg, bearer_proxy.url, "--prometheus-token-file", _secret(tmp_path, "tok", TOKEN))
    assert rc == 0, err
    assert bearer_proxy.refused == 0

    rc, err = _run_once(capsys, cfg, bearer_proxy.url)  # no token at all
    assert rc == 1 and "refused access (HTTP 401)" in err, err


def test_run_rejects_contradictory_auth_inputs(testbed, clean_env, tmp_path, capsys):
    """Bad combinations are bad input (exit 2) before anything is contacted, as for ``audit``."""
    cfg = _settings(testbed, tmp_path)
    url = "http://127.0.0.1:9"
    rc, err = _run_once(capsys, cfg, url, "--prometheus-user", USER)
    assert rc == 2 and "--prometheus-user needs --prometheus-password-file" in err, err
    rc, err = _run_once(capsys, cfg, url, "--prometheus-password-file", _secret(tmp_path, "pw", PASSWORD))
    assert rc == 2 and "--prometheus-password-file needs --prometheus-user" in err, err
    clean_env.setenv("GPU_AUDITOR_PROMETHEUS_PASSWORD", PASSWORD)
    rc, err = _run_once(
        capsys, cfg, url, "--prometheus-user", USER, "--prometheus-token-file", _secret(tmp_path, "t", TOKEN)
    )
    assert rc == 2 and "not both" in err, err


def test_audit_and_doctor_send_the_same_credentials(basic_proxy, bearer_proxy, clean_env, tmp_path, capsys):
    pw = _secret(tmp_path, "pw", PASSWORD)
    db = f"sqlite:///{tmp_path / 'audit.db'}"
    basic = ["--prometheus", basic_proxy.url, "--prometheus-user", USER, "--prometheus-password-file", pw]
    match = ["--match", f"case=auth{uuid.uuid4().hex[:8]}"]
    rc = main(["audit", *basic, *match, "--no-kube", "--start", "now-15m", "--db", db, "--output", "json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads(out.out) == []
    rc = main(["doctor", *basic, *match, "--output", "json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert checks["Prometheus reachable"]["status"] == "ok"
    assert basic_proxy.authorized >= 4 and basic_proxy.refused == 0

    clean_env.setenv("GPU_AUDITOR_PROMETHEUS_TOKEN", TOKEN)
    rc = main(["doctor", "--prometheus", bearer_proxy.url, *match, "--output", "json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert checks["Prometheus reachable"]["status"] == "ok"
    assert bearer_proxy.authorized >= 1 and bearer_proxy.refused == 0
