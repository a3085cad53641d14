"""The chart's console switches: on and read-only by default (settings console.enabled/writes),
writes only when asked, and an Ingress that routes only /console to the Service, refused by the
schema without a host."""

from __future__ import annotations

import yaml
from chartlib import Chart, find

from auditor.settings import Settings


def settings_of(objs: list[dict]) -> Settings:
    (cm,) = [o for o in find(objs, "ConfigMap") if o["metadata"]["name"].endswith("-settings")]
    return Settings.model_validate(yaml.safe_load(cm["data"]["settings.yaml"]))


def test_console_is_on_and_read_only_by_default_without_an_ingress(chart: Chart) -> None:
    objs = chart.render()
    s = settings_of(objs)
    assert (s.console.enabled, s.console.writes) == (True, False)
    assert not find(objs, "Ingress")


def test_console_writes_and_ingress_render_when_asked(chart: Chart) -> None:
    objs = chart.render(
        sets=[
            "console.writes=true",
            "console.ingress.enabled=true",
            "console.ingress.host=gpu.example.com",
            "console.ingress.className=nginx",
            "console.ingress.tls[0].secretName=gpu-tls",
            "console.ingress.tls[0].hosts[0]=gpu.example.com",
        ]
    )
    assert settings_of(objs).console.writes is True
    (ing,) = find(objs, "Ingress", "ga-gpu-auditor-console")
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "gpu.example.com" and ing["spec"]["ingressClassName"] == "nginx"
    (path,) = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/console", "Prefix")
    (svc,) = find(objs, "Service", "ga-gpu-auditor")
    assert path["backend"]["service"] == {"name": "ga-gpu-auditor", "port": {"name": "http"}}
    assert "http" in [p["name"] for p in svc["spec"]["ports"]]
    assert ing["spec"]["tls"] == [{"secretName": "gpu-tls", "hosts": ["gpu.example.com"]}]


def test_console_ingress_needs_a_host_and_the_console(chart: Chart) -> None:
    no_host = chart.template_text(sets=["console.ingress.enabled=true"], check=False)
    assert no_host.rc != 0 and "console" in no_host.err
    off = chart.template_text(
        sets=["console.enabled=false", "console.ingress.enabled=true", "console.ingress.host=a.b"], check=False
    )
    assert off.rc != 0 and "console" in off.err
