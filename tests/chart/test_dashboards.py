"""The chart's Grafana dashboards (per pod, per team, per cluster), as Grafana would load them.

No Grafana package exists here (Debian has none; PyPI's "grafana" names are API clients), so
each dashboard is checked against Grafana's dashboard schema as upstream states it: the
dashboard kind's schema reference (grafana/grafana docs/sources/developers/kinds/core/dashboard/
schema-reference.md: ``schemaVersion`` required, ``graphTooltip`` one of 0, 1, 2; the uid a
string of 8 to 40 characters) and the panel grid of grafana-foundation-sdk's generated
builders (GridPos: ``h > 0``, ``0 < w <= 24``, ``0 <= x < 24``). Every query is then parsed by
the real promtool and run on the bed's real Prometheus, and every series it names is one the
operator exports (tests/operator/test_fleet_metrics.py scrapes them) or one the chart's
recording rules record.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests
import yaml
from chartlib import FULL_VALUES, Chart, find

from auditor.core.job_summary import JobSummary
from auditor.core.model import Window
from auditor.operator_loop.fleet_metrics import families
from auditor.operator_loop.health import OperatorMetrics
from auditor.store.status_queries import StatusCounts

pytestmark = pytest.mark.testbed

KEYS = ("gpu-auditor-efficiency.json", "gpu-auditor-teams.json", "gpu-auditor-cluster.json")
PANEL_TYPES = {"stat", "timeseries", "table", "bargauge"}
#: Grafana's own variables a query may use besides the dashboard's
GLOBALS = {"__range", "__rate_interval", "__interval"}
_VAR = re.compile(r"\$\{?(\w+)\}?")
_NAME = re.compile(r"\b((?:gpu_auditor_|pod_gpu:)[A-Za-z0-9_:]+)")


@pytest.fixture(scope="module")
def rendered(chart: Chart) -> tuple[dict[str, dict], list[dict]]:
    objs = chart.render(values=[FULL_VALUES])
    (cm,) = find(objs, "ConfigMap", "ga-gpu-auditor-dashboard")
    assert sorted(cm["data"]) == sorted(KEYS)
    return {k: json.loads(cm["data"][k]) for k in KEYS}, objs


def _queries(dash: dict) -> list[str]:
    out = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    out += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return out


def _promql(expr: str) -> str:
    """A panel query with Grafana's variables filled in as Grafana would for "All"."""
    return (
        expr.replace("$__range", "7d")
        .replace("$__rate_interval", "5m")
        .replace("$__interval", "5m")
        .replace('=~"$namespace"', '=~".*"')
        .replace('=~"$cluster"', '=~".*"')
        .replace('=~"$team"', '=~".*"')
    )


def test_each_dashboard_fits_grafanas_schema(rendered: tuple[dict[str, dict], list[dict]]) -> None:
    dashes, _ = rendered
    uids = set()
    for key, d in dashes.items():
        assert isinstance(d["schemaVersion"], int) and 0 < d["schemaVersion"] < 2**16, key
        assert d["graphTooltip"] in (0, 1, 2) and isinstance(d["editable"], bool)
        assert isinstance(d["uid"], str) and 8 <= len(d["uid"]) <= 40 and d["uid"] not in uids
        uids.add(d["uid"])
        assert d["title"] and set(d["time"]) == {"from", "to"}
        names = {v["name"] for v in d["templating"]["list"]}
        assert "datasource" in names and len(names) == len(d["templating"]["list"])
        ids = [p["id"] for p in d["panels"]]
        assert len(set(ids)) == len(ids) and all(isinstance(i, int) for i in ids)
        cells: set[tuple[int, int]] = set()
        for p in d["panels"]:
            g = p["gridPos"]
            assert g["h"] > 0 and 0 < g["w"] <= 24 and 0 <= g["x"] < 24 and g["x"] + g["w"] <= 24 and g["y"] >= 0
            area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & area, f"{key}: panel {p['title']!r} overlaps another"
            cells |= area
            assert p["type"] in PANEL_TYPES and p["title"] and p["datasource"]["uid"] == "${datasource}"
            refs = [t["refId"] for t in p["targets"]]
            assert refs and len(set(refs)) == len(refs)
        for q in _queries(d):
            used = set(_VAR.findall(q)) - GLOBALS
            assert used <= names, f"{key}: {q} uses undefined {used - names}"


def test_every_query_parses_with_promtool(rendered: tuple[dict[str, dict], list[dict]], tmp_path: Path) -> None:
    dashes, _ = rendered
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with the prometheus package (Makefile SYSTEM_PACKAGES)"
    exprs = [_promql(e) for d in dashes.values() for e in _queries(d) if not e.startswith("label_values(")]
    rules = {
        "groups": [{"name": "dashboards", "rules": [{"record": f"q:{i}", "expr": e} for i, e in enumerate(exprs)]}]
    }
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(rules))
    res = subprocess.run([promtool, "check", "rules", str(tmp_path / "q.yaml")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(exprs)} rules found" in res.stdout


def test_every_query_runs_on_real_prometheus(rendered: tuple[dict[str, dict], list[dict]], testbed) -> None:
    dashes, _ = rendered
    for key in ("gpu-auditor-teams.json", "gpu-auditor-cluster.json"):
        for e in _queries(dashes[key]):
            if e.startswith("label_values("):
                metric = e[len("label_values(") :].rsplit(",", 1)[0]
                e = f"count({_promql(metric)})"
            r = requests.get(f"{testbed.prometheus_url}/api/v1/query", params={"query": _promql(e)}, timeout=30)
            assert r.status_code == 200 and r.json()["status"] == "success", (key, e, r.text)


def _exported() -> set[str]:
    """Every sample name the operator's registry serves once each series has a value."""
    m = OperatorMetrics()
    docs = json.loads((Path(__file__).parents[1] / "golden/audit/demo.json").read_text())
    now = datetime(2026, 11, 25, 15, 5, tzinfo=timezone.utc)
    m.fleet.observe_cycle("demo", Window(now - timedelta(minutes=35), now), [JobSummary.from_json(d) for d in docs], [])
    st = StatusCounts(
        jobs={("llm", "idle"): (1, 2.0, 2.0, 2.0)},
        open_violations={("llm", "p"): 1},
        acks_active={"ack": 1},
        deliveries={("slack", "sent"): 1},
        actions={("notify", "failed"): 1},
    )
    m.fleet.snapshot.replace(families(st, "demo", lambda t: t))
    m.fleet.snapshot.held = lambda: 0
    m.fleet.actions.labels("demo", "notify", "done").inc()
    m.cycle_seconds.observe(1.0)
    m.errors.labels("x").inc()
    m.alerts_undelivered.labels("a", "no_destination").inc()
    return {s.name for fam in m.registry.collect() for s in fam.samples}


def test_every_series_is_exported_or_recorded(rendered: tuple[dict[str, dict], list[dict]]) -> None:
    dashes, objs = rendered
    (rule,) = find(objs, "PrometheusRule")
    recorded = {r["record"] for g in rule["spec"]["groups"] for r in g["rules"] if "record" in r}
    exported = _exported()
    for key, d in dashes.items():
        for name in {n for q in _queries(d) for n in _NAME.findall(q)}:
            assert name in (recorded if name.startswith("pod_gpu:") else exported), f"{key}: {name} is never written"
