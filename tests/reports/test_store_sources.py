"""Every store-reading command finds the store as ``run`` does (issue 12, items 3 and 12).

``report``, ``explain``, ``policy simulate`` and ``actions`` read ``--db``, else
``GPU_AUDITOR_DATABASE_URL``, else the settings file (``--config``, ``$GPU_AUDITOR_CONFIG``, the
chart's ``/etc/gpu-auditor/settings.yaml``); a report names the store it read, password masked;
a store without jobs is an error naming it; ``explain NS/Pod/NAME`` of a job's pod explains
the job. Against the test bed's PostgreSQL (and SQLite), the chart rendered by the real helm.
The user's default SQLite file is moved into the test's directory (XDG_DATA_HOME) and must stay
unopened whenever another store is named.
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from reportgen import GenJob, job_buckets, store_jobs

from auditor.cli.main import main
from auditor.core.model import JobRef, PodRef
from auditor.errors import BadInput
from auditor.reports.weeks import IsoWeek, zone
from auditor.settings import load_cli_settings
from auditor.store import Store
from auditor.store.urls import default_path, display_url, resolve, secrets_of

ROOT = Path(__file__).resolve().parents[2]
UTC = timezone.utc
#: the seeded week: far from any clock the suite runs under, so "recent" data never falls in it
W = IsoWeek(2025, 10)
WS, WE = W.bounds(zone("UTC"))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No store variables from the caller; the default SQLite file under tmp_path; no chart file."""
    for var in (
        "GPU_AUDITOR_DATABASE_URL",
        "GPU_AUDITOR_CONFIG",
        "GPU_AUDITOR_STORE__URL",
        "GPU_AUDITOR_STORE__URL_ENV",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr("auditor.settings.DEFAULT_SETTINGS_FILE", tmp_path / "no-chart" / "settings.yaml")
    return tmp_path


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.testbed)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/store.db" if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def seed(url: str) -> None:
    """Two jobs in week W (teams a, b: 3 + 4 GPU-hours) and one ended an hour ago (team sim),
    which ``policy simulate --since 1d`` sees whatever the clock."""
    wall = datetime.now(UTC).replace(second=0, microsecond=0)
    with Store.open(url) as s:
        store_jobs(
            s,
            [
                GenJob("a", "j1", WS + timedelta(hours=10), 3, 1, "low_sm"),
                GenJob("b", "j2", WS + timedelta(days=2), 2, 2, "healthy"),
                GenJob("sim", "recent", wall - timedelta(hours=3), 2, 1, "low_sm"),
            ],
            now=wall,
        )


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def check_reads(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str] = ()) -> None:
    """report, explain, policy simulate and actions, without --db, all read the store at ``url``."""
    shown = display_url(resolve(url))
    out_dir = tmp_path / "out"
    rc, out, err = run_cli(
        ["report", "--week", str(W), "--format", "json,md,html", "--out", str(out_dir), *extra], capsys
    )
    assert rc == 0, err
    doc = json.loads((out_dir / f"report-{W}.json").read_text())
    assert doc["total"]["gpu_hours"] == 7.0 and sorted(t["team"] for t in doc["teams"]) == ["a", "b"]
    assert doc["store"] == shown and f"reading store {shown}" in err
    assert f"from store {shown}" in (out_dir / f"report-{W}.md").read_text()
    assert f'data-k="store">{shown}<' in (out_dir / f"report-{W}.html").read_text()

    rc, out, err = run_cli(["explain", "ns-a/Job/j1", *extra], capsys)
    assert rc == 0, err
    assert out.startswith("ns-a/Job/j1") and "verdict: low_sm_efficiency" in out

    rc, out, err = run_cli(["policy", "simulate", "--since", "1d", "--output", "json", *extra], capsys)
    assert rc == 0, err
    res = json.loads(out)
    assert res["jobs"] == 1 and res["store"] == shown

    rc, out, err = run_cli(["actions", "--since", "1d", *extra], capsys)
    assert rc == 0, err
    assert f"reading store {shown}" in err

    for secret in secrets_of(resolve(url)):
        assert secret not in json.dumps(doc) and secret not in err
    assert not default_path().exists(), "the user's default SQLite file was opened"


@pytest.mark.parametrize("source", ["variable", "config flag", "config variable"])
def test_commands_read_the_store_the_settings_name(source: str, db: str, tmp_path: Path, monkeypatch, capsys) -> None:
    seed(db)
    extra: list[str] = []
    if source == "variable":  # GPU_AUDITOR_DATABASE_URL alone
        monkeypatch.setenv("GPU_AUDITOR_DATABASE_URL", db)
    elif source == "config flag":  # --config FILE with store.url
        cfg = tmp_path / "settings.yaml"
        cfg.write_text(yaml.safe_dump({"store": {"url": db}}))
        extra = ["--config", str(cfg)]
    else:  # $GPU_AUDITOR_CONFIG naming a file whose store.url_env names another variable
        cfg = tmp_path / "settings.yaml"
        cfg.write_text(yaml.safe_dump({"cluster": "c1", "store": {"url_env": "MY_STORE_URL"}}))
        monkeypatch.setenv("GPU_AUDITOR_CONFIG", str(cfg))
        monkeypatch.setenv("MY_STORE_URL", db)
    check_reads(db, tmp_path, capsys, extra)


def _render_chart(helm: str, *sets: str) -> list[dict]:
    proc = subprocess.run(
        [
            helm,
            "template",
            "ga",
            str(ROOT / "charts" / "gpu-auditor"),
            "--namespace",
            "gpu-auditor",
            # what the test bed's apiserver (1.36) serves; `helm template` alone assumes none of it
            "--api-versions",
            "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
            *[a for s in sets for a in ("--set", s)],
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_commands_in_the_operators_pod_read_the_charts_store(
    testbed, postgres_url: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    """What `kubectl exec deploy/ga-gpu-auditor -- gpu-auditor report ...` sees: the rendered
    settings file at the chart's path and the Deployment's GPU_AUDITOR_DATABASE_URL; no flags."""
    objs = _render_chart(testbed.helm, "store.type=postgresql", "store.postgresql.urlSecret.name=ga-db")
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-settings")]
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert "/etc/gpu-auditor/settings.yaml" in container["args"]
    assert "GPU_AUDITOR_DATABASE_URL" in {e["name"] for e in container.get("env", [])}
    settings_file = tmp_path / "etc" / "settings.yaml"
    settings_file.parent.mkdir()
    settings_file.write_text(cm["data"]["settings.yaml"])
    monkeypatch.setattr("auditor.settings.DEFAULT_SETTINGS_FILE", settings_file)
    monkeypatch.setenv("GPU_AUDITOR_DATABASE_URL", postgres_url)
    assert load_cli_settings(None).database_url() == postgres_url
    seed(postgres_url)
    check_reads(postgres_url, tmp_path, capsys)


def test_precedence_db_flag_then_variable_then_file(tmp_path: Path, monkeypatch) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text("store: {url: sqlite:///from-file.db}\n")
    env = {"GPU_AUDITOR_DATABASE_URL": "sqlite:///from-env.db"}
    flag = {"store": {"url": "sqlite:///from-flag.db", "url_env": None}}
    assert load_cli_settings(cfg, environ={}).database_url() == "sqlite:///from-file.db"
    assert load_cli_settings(cfg, environ=env).database_url(env) == "sqlite:///from-env.db"
    assert load_cli_settings(cfg, environ=env, overrides=flag).database_url(env) == "sqlite:///from-flag.db"
    # an empty variable (a Secret without the key) is no setting
    assert load_cli_settings(cfg, environ={"GPU_AUDITOR_DATABASE_URL": ""}).database_url() == "sqlite:///from-file.db"
    # the file: --config, else $GPU_AUDITOR_CONFIG, else the chart's path when it exists, else none
    assert load_cli_settings(None, environ={"GPU_AUDITOR_CONFIG": str(cfg)}).database_url() == "sqlite:///from-file.db"
    assert load_cli_settings(None, environ={}).database_url() is None
    chart_file = tmp_path / "chart.yaml"
    chart_file.write_text("store: {url: sqlite:///from-chart.db}\n")
    monkeypatch.setattr("auditor.settings.DEFAULT_SETTINGS_FILE", chart_file)
    assert load_cli_settings(None, environ={}).database_url() == "sqlite:///from-chart.db"
    with pytest.raises(BadInput, match="settings file .*missing.yaml: cannot read"):
        load_cli_settings(tmp_path / "missing.yaml", environ={})


READERS = (
    ["report", "--week", str(W), "--format", "json", "--out", "OUT"],
    ["explain", "ns-a/Job/j1"],
    ["policy", "simulate", "--since", "7d"],
    ["actions"],
)


def test_an_empty_store_is_an_error_naming_it(db: str, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("GPU_AUDITOR_DATABASE_URL", db)
    shown = display_url(resolve(db))
    readers = [[str(tmp_path / "o") if a == "OUT" else a for a in argv] for argv in READERS]
    if db.startswith("sqlite"):  # a file that is not there: refused, and not created
        for argv in readers:
            rc, out, err = run_cli(argv, capsys)
            assert rc == 1 and f"store {shown}: no such file, so no audited jobs" in err, (argv, err)
        assert not Path(resolve(db).database).exists()
        Store.open(db).close()  # now there, migrated, and empty
    for argv in readers:
        rc, out, err = run_cli(argv, capsys)
        assert rc == 1, (argv, err)
        assert f"store {shown} holds no audited jobs" in err and "GPU_AUDITOR_DATABASE_URL" in err, err
        assert out == ""
    assert not (tmp_path / "o" / f"report-{W}.json").exists()
    # a store with jobs, but none in the week asked for: an empty report (exit 0) that says so
    seed(db)
    rc, _, err = run_cli(["report", "--week", "2025-W20", "--format", "json", "--out", str(tmp_path / "o")], capsys)
    assert rc == 0 and f"No jobs were recorded in 2025-W20. (store {shown})" in err


def test_explain_of_a_jobs_pod_explains_the_job(db: str, capsys) -> None:
    seed(db)
    rc, out, err = run_cli(["explain", "ns-a/Pod/j1-0", "--db", db], capsys)
    assert rc == 0, err
    assert "pod ns-a/j1-0 belongs to the audited job ns-a/Job/j1 (cluster c1)" in err
    assert out.startswith("ns-a/Job/j1") and "j1-0 node-0:gpu0" in out  # its timeline, by the one GPU name
    rc, out, err = run_cli(["explain", "ns-a/pod/nobody-0", "--db", db], capsys)
    assert rc == 1 and "no audited job ns-a/Pod/nobody-0 in store" in err
    # the same pod name in a later job (a StatefulSet re-created): ambiguous, both named
    with Store.open(db) as s:
        ref = JobRef("c1", "ns-a", "StatefulSet", "j1-again", "uid-x", "a")
        start = WS + timedelta(days=3)
        jid = s.upsert_job(ref, start, start + timedelta(hours=1))
        s.replace_buckets(
            jid, job_buckets(GenJob("a", "j1-again", start, 1, 1, "healthy"), PodRef("ns-a", "j1-0", "main"), "node-9")
        )
    rc, out, err = run_cli(["explain", "ns-a/Pod/j1-0", "--db", db], capsys)
    assert rc == 2 and "ns-a/StatefulSet/j1-again (cluster c1)" in err and "ns-a/Job/j1 (cluster c1)" in err
