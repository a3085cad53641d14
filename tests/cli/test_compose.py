"""The composition root's Prometheus credentials: which input wins, what is refused (no server).

The end-to-end proof (every command sends them, through an authenticating proxy) is
tests/operator/test_prometheus_auth.py; this is the precedence table behind it.
"""

from __future__ import annotations

import pytest

from auditor.compose import PrometheusAuth, prometheus_credentials, prometheus_source
from auditor.errors import BadInput
from auditor.settings import load_settings

CHART = {"prometheus": {"url": "http://p:9090", "bearer_token_env": "CHART_TOKEN"}}
BASIC = {"prometheus": {"url": "http://p:9090", "username_env": "PROM_USER", "password_env": "PROM_PW"}}


def _settings(data: dict):
    return load_settings(None, environ={}, overrides=data)


def _file(tmp_path, name: str, value: str) -> str:
    p = tmp_path / name
    p.write_text(value + "\n")
    return str(p)


def test_the_settings_credentials_without_a_command_line():
    env = {"CHART_TOKEN": "t1", "PROM_USER": "u", "PROM_PW": "pw"}
    assert prometheus_credentials(_settings(CHART), None, env) == ("t1", None)
    assert prometheus_credentials(_settings(BASIC), None, env) == (None, ("u", "pw"))
    # a command line that gives none leaves them in force
    assert prometheus_credentials(_settings(CHART), PrometheusAuth(), env) == ("t1", None)
    with pytest.raises(BadInput, match="prometheus.bearer_token_env: environment variable CHART_TOKEN is not set"):
        prometheus_credentials(_settings(CHART), None, {})


def test_the_command_line_wins_over_the_settings(tmp_path):
    env = {"CHART_TOKEN": "t1"}
    auth = PrometheusAuth(user="alice", password_file=_file(tmp_path, "pw", "s3cret"))
    assert prometheus_credentials(_settings(CHART), auth, env) == (None, ("alice", "s3cret"))
    auth = PrometheusAuth(token_file=_file(tmp_path, "tok", "t2"))
    assert prometheus_credentials(_settings(BASIC), auth, {}) == ("t2", None)
    # the CLI's variables count as the command line, and only for a command
    env = {"GPU_AUDITOR_PROMETHEUS_TOKEN": " t3 \n", "GPU_AUDITOR_PROMETHEUS_PASSWORD": "pw3"}
    assert prometheus_credentials(_settings({}), PrometheusAuth(), env) == ("t3", None)
    assert prometheus_credentials(_settings({}), None, env) == (None, None)
    only_pw = {"GPU_AUDITOR_PROMETHEUS_PASSWORD": "pw3"}
    assert prometheus_credentials(_settings(CHART), PrometheusAuth(user="bob"), only_pw) == (None, ("bob", "pw3"))


def test_contradictions_and_unreadable_secrets_are_bad_input(tmp_path):
    s = _settings({})
    with pytest.raises(BadInput, match="--prometheus-user needs --prometheus-password-file"):
        prometheus_credentials(s, PrometheusAuth(user="u"), {})
    with pytest.raises(BadInput, match="--prometheus-password-file needs --prometheus-user"):
        prometheus_credentials(s, PrometheusAuth(password_file=_file(tmp_path, "pw", "x")), {})
    with pytest.raises(BadInput, match="not both"):
        prometheus_credentials(
            s, PrometheusAuth(user="u"), {"GPU_AUDITOR_PROMETHEUS_TOKEN": "t", "GPU_AUDITOR_PROMETHEUS_PASSWORD": "p"}
        )
    with pytest.raises(BadInput, match="--prometheus-token-file .*: file is empty"):
        prometheus_credentials(s, PrometheusAuth(token_file=_file(tmp_path, "empty", "")), {})
    with pytest.raises(BadInput, match="--prometheus-token-file .*: cannot read"):
        prometheus_credentials(s, PrometheusAuth(token_file=str(tmp_path / "absent")), {})
    both = {"prometheus": {**CHART["prometheus"], "username_env": "U", "password_env": "P"}}
    with pytest.raises(BadInput, match="bearer_token_env or username_env/password_env, not both"):
        prometheus_credentials(_settings(both), None, {"CHART_TOKEN": "t", "U": "u", "P": "p"})


def test_the_source_takes_every_connection_setting(tmp_path):
    ca = _file(tmp_path, "ca.pem", "not checked until TLS is used")
    s = _settings(
        {
            "prometheus": {
                "url": "https://thanos.example/prom/",
                "timeout": "15s",
                "retries": 0,
                "ca_file": ca,
                "matchers": {"cluster": "prod"},
                "label_convention": "exported_pod",
            }
        }
    )
    src = prometheus_source(s, PrometheusAuth(token_file=_file(tmp_path, "tok", "t")), {})
    try:
        assert src.url == "https://thanos.example/prom" and src.client.timeout == 15.0
        assert src.client.session.headers["Authorization"] == "Bearer t" and src.client.session.verify == ca
        assert src.matchers == {"cluster": "prod"} and src.forced is not None and src.forced.pod == "exported_pod"
    finally:
        src.close()
    with pytest.raises(BadInput, match="prometheus.url is not set"):
        prometheus_source(_settings({}), None, {})
    with pytest.raises(BadInput, match="no such file"):
        prometheus_source(_settings({"prometheus": {"url": "http://p", "ca_file": str(tmp_path / "x")}}), None, {})
