"""The rendered contracts, byte for byte: audit JSON, the verdict table, ``explain``, the demo
page, the weekly report in every format with its Slack and webhook deliveries, and the policy
alerts (Slack + webhook) — each compared with its file under ``tests/golden/``.

Inputs are fixed (the bundled H200 traces replayed through the real engine, a SQLite store in a
temporary directory, local HTTP receivers) and ``now`` is injected, so a difference is a change
of the output. ``GPU_AUDITOR_UPDATE_GOLDEN=1`` rewrites the files (README.md here says when).
No server is needed.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest
from policy.policy_receivers import Receiver

from auditor.cli.demo import scenario
from auditor.cli.main import main
from auditor.core.job_summary import JobSummary
from auditor.core.model import PodRef, Window
from auditor.correlate import NoKubeResolver
from auditor.engine import run_audit
from auditor.notify import SlackNotifier, WebhookNotifier
from auditor.policy.loader import load_dir
from auditor.policy.runner import PolicyRunner, Route, RunnerConfig
from auditor.render.html import render_html as render_page
from auditor.render.table import format_table
from auditor.reports import IsoWeek, generate
from auditor.reports.delivery import Destinations, build_trigger, send_due_reports
from auditor.reports.formats import teams_csv, to_json, to_markdown, write_jobs_csv
from auditor.reports.html import render_html as render_report
from auditor.reports.service import iter_jobs
from auditor.sources.replay import ReplaySource
from auditor.store import Store
from auditor.traces import TraceJob, load_trace, make_gpus

HERE = Path(__file__).parent
UPDATE = os.environ.get("GPU_AUDITOR_UPDATE_GOLDEN") == "1"

#: the demo cluster's clock: a Wednesday afternoon of ISO week 2026-W48
NOW = datetime(2026, 11, 25, 15, 0, 0, tzinfo=timezone.utc)
#: the weekly report's send time: the Monday 08:00 after that week
REPORT_AT = datetime(2026, 11, 30, 8, 0, 0, tzinfo=timezone.utc)
WEEK = IsoWeek.parse("2026-W48")
#: the per-phase trace audits end here (not bucket-aligned, like tests/audit/test_trace_verdicts.py)
TRACE_END = datetime(2026, 11, 30, 12, 0, 7, tzinfo=timezone.utc)
POLICY_SECRET = "golden-secret"
#: the policy webhook's ``sent_at`` is the notifier's own wall clock (the runner has no clock to give it)
_SENT_AT = re.compile(rb'"sent_at": "[^"]*"')
#: a Slack delivery's id is a fresh uuid4 (Slack has no idempotency key to keep it stable for)
_SLACK_ID = re.compile(r'"slack": \{([^{}]*?)"delivery_id": "[0-9a-f-]+"')


def check(name: str, text: str | bytes) -> None:
    """``text`` must equal the golden file ``name`` byte for byte (rewritten under UPDATE)."""
    path = HERE / name
    data = text.encode() if isinstance(text, str) else text
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
        return
    assert path.exists(), f"{path} is missing: run with GPU_AUDITOR_UPDATE_GOLDEN=1 once"
    want = path.read_bytes()
    if data != want:
        got_lines, want_lines = data.decode().splitlines(), want.decode().splitlines()
        first = next(
            (i for i, (a, b) in enumerate(zip(got_lines, want_lines)) if a != b), min(len(got_lines), len(want_lines))
        )
        pytest.fail(
            f"{name} differs from its golden file at line {first + 1}:\n"
            f"  golden: {want_lines[first] if first < len(want_lines) else '<end>'}\n"
            f"  now:    {got_lines[first] if first < len(got_lines) else '<end>'}\n"
            "If the change is intended, rerun with GPU_AUDITOR_UPDATE_GOLDEN=1 and say why in the commit.",
            pytrace=False,
        )


def audit_json(summaries: list[JobSummary]) -> str:
    """``gpu-auditor audit -o json`` prints the summaries like this (cli/audit.py)."""
    return json.dumps([s.to_json() for s in summaries], indent=2, sort_keys=False, default=str) + "\n"


# --------------------------------------------------------------------------- audit JSON


def _trace_audit(trace_name: str) -> list[JobSummary]:
    """One ``--no-kube`` pod per workload phase, replayed for an hour (as the e2e test and
    tests/audit/test_trace_verdicts.py build them)."""
    trace = load_trace(trace_name)
    jobs = [
        TraceJob(PodRef("bench", p.replace("_", "-"), "main"), make_gpus(1, f"node-{p}"), p) for p in trace.phases()
    ]
    src = ReplaySource([(trace, jobs)], end=TRACE_END, duration=timedelta(hours=1), interval=timedelta(seconds=15))
    res = run_audit(src, NoKubeResolver(), None, Window(TRACE_END - timedelta(hours=3), TRACE_END), now=TRACE_END)
    return res.summaries


@pytest.mark.parametrize("trace_name", ["h200-demo-cluster", "h200-workloads"])
def test_audit_json_of_each_trace_phase(trace_name: str) -> None:
    summaries = _trace_audit(trace_name)
    check(f"audit/{trace_name}.json", audit_json(summaries))
    check(f"table/{trace_name}.txt", format_table(summaries))
    check(f"table/{trace_name}-wide.txt", format_table(summaries, wide=True))


@dataclass
class Demo:
    """The demo cluster audited into a SQLite store (what ``gpu-auditor demo`` does)."""

    db: str
    summaries: list[JobSummary]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    sc = scenario(NOW)
    db = f"sqlite:///{tmp_path_factory.mktemp('golden') / 'demo.sqlite'}"
    store = Store.open(db)
    try:
        source = ReplaySource(sc.feeds, end=NOW, duration=sc.duration, interval=sc.interval)
        res = run_audit(source, sc.resolver, store, sc.window, now=NOW)
    finally:
        store.close()
    yield Demo(db, res.summaries)


def test_demo_audit_json_table_and_page(demo: Demo) -> None:
    check("audit/demo.json", audit_json(demo.summaries))
    check("table/demo.txt", format_table(demo.summaries))
    check("table/demo-wide.txt", format_table(demo.summaries, wide=True))
    sc = scenario(NOW)
    page = render_page(
        demo.summaries,
        title="gpu-auditor demo: a small H200 cluster",
        generated_at=NOW,
        window_start=sc.window.start.isoformat(),
        window_end=sc.window.end.isoformat(),
        source="replayed from real H200 traces",
        with_charts=False,  # PNG bytes depend on matplotlib and fonts; their numbers are in the page
    )
    check("page/demo.html", page)


@pytest.mark.parametrize(
    "job",
    [
        "llm/PyTorchJob/llm-finetune",
        "research/Job/softmax-bench",
        "recsys/Job/legacy-ranker",
        "llm/PyTorchJob/llm-pretrain-naive-attn",  # the founding case: MFU, its reference, the gap
        "vision/Pod/mlp-baseline",  # MFU n/a: no tensor-core work
    ],
)
def test_explain(demo: Demo, job: str, capsys: pytest.CaptureFixture[str]) -> None:
    name = job.replace("/", "_")
    assert main(["explain", job, "--db", demo.db]) == 0
    check(f"explain/{name}.txt", capsys.readouterr().out)
    if job == "research/Job/softmax-bench":  # the JSON holds every bucket: one small job is enough
        assert main(["explain", job, "--db", demo.db, "--output", "json"]) == 0
        check(f"explain/{name}.json", capsys.readouterr().out)


# --------------------------------------------------------------------------- weekly report


def test_weekly_report_formats(demo: Demo) -> None:
    store = Store.open(demo.db)
    try:
        report = generate(store, WEEK, now=REPORT_AT)
        team = generate(store, WEEK, now=REPORT_AT, team="llm")
        import io

        jobs = io.StringIO()
        write_jobs_csv(jobs, str(WEEK), iter_jobs(store, WEEK))
    finally:
        store.close()
    check("report/cluster.json", to_json(report))
    check("report/cluster.md", to_markdown(report))
    check("report/cluster.html", render_report(report, with_charts=False))
    check("report/teams.csv", teams_csv(report))
    check("report/jobs.csv", jobs.getvalue())
    check("report/team-llm.json", to_json(team))
    check("report/team-llm.md", to_markdown(team))
    check("report/team-llm.html", render_report(team, with_charts=False))


def test_weekly_report_deliveries(demo: Demo) -> None:
    """What Slack and the webhook receive when the week's reports go out (send_due_reports)."""
    admin, team, hook = Receiver(), Receiver(), Receiver()
    store = Store.open(demo.db)
    try:
        dest = Destinations(
            team_slack={"llm": SlackNotifier(team.url)},
            admin_slack=SlackNotifier(admin.url),
            webhook=WebhookNotifier(hook.url, "golden-report-key", clock=lambda: REPORT_AT),
        )
        sent = send_due_reports(store, REPORT_AT, trigger=build_trigger(), destinations=dest, holder="golden")
    finally:
        store.close()
        for r in (admin, team, hook):
            r.close()
    assert not sent.failed and len(sent.sent) == 7, sent  # 2 Slack + 4 teams' and the cluster's webhook
    check("report/slack-cluster.json", admin.requests[0].body)
    check("report/slack-team-llm.json", team.requests[0].body)
    bodies = sorted(hook.requests, key=lambda r: r.headers["X-Gpu-Auditor-Delivery"])
    for r in bodies:
        scope = r.json()["data"]["report"]
        check(f"report/webhook-{scope['total']['team'] if scope['scope'] == 'team' else 'cluster'}.json", r.body)


# --------------------------------------------------------------------------- policy alerts


def test_policy_alert_payloads(demo: Demo) -> None:
    """The bundled policies over the demo cluster, two cycles 31 min apart (annotate/event, then
    notify): every Slack and webhook alert as sent."""
    slack, hook = Receiver(), Receiver()
    store = Store.open(demo.db)
    try:
        cfg = RunnerConfig(
            cluster="demo",
            default_route=Route(slack_url=slack.url, webhook_url=hook.url, webhook_secret=POLICY_SECRET),
        )
        runner = PolicyRunner(load_dir(Path(__file__).parents[2] / "policies"), store, None, cfg)
        decisions = []
        for k in range(2):
            decisions += runner.run_cycle(demo.summaries, now=NOW + timedelta(minutes=31 * k), act=True)
    finally:
        store.close()
        slack.close()
        hook.close()
    text = json.dumps([d.as_dict() for d in decisions], indent=2, default=str) + "\n"
    check("policy/decisions.json", _SLACK_ID.sub('"slack": {\\1"delivery_id": "<random>"', text))
    # the one-GPU jobs of high-util-low-sm and idle-gpus, and the 4-GPU llm-finetune that
    # high-util-low-sm judges GPU by GPU (issue 30)
    assert len(slack.requests) == len(hook.requests) == 5
    for r in sorted(slack.requests, key=lambda r: r.body):
        job = re.search(r"gpu-auditor: (\S+) breaks", r.json()["text"])
        assert job
        check(f"policy/slack-{job.group(1).replace('/', '_')}.json", r.body)
    for r in sorted(hook.requests, key=lambda r: r.body):
        data = r.json()["data"]
        name = f"{data['job']['namespace']}_{data['job']['job'].replace('/', '_')}"
        check(f"policy/webhook-{name}.json", _SENT_AT.sub(b'"sent_at": "<sent_at>"', r.body))


def test_policy_simulate_json(demo: Demo) -> None:
    """``policy simulate -o json``'s backtest of the bundled policies over the demo store: hits,
    actions, per-day counts and near misses (issue 30); the CLI adds the store's URL in front."""
    from auditor.policy.backtest import simulate

    store = Store.open(demo.db)
    try:
        result = simulate(
            store, load_dir(Path(__file__).parents[2] / "policies"), since=NOW - timedelta(days=7), until=NOW
        )
    finally:
        store.close()
    check("policy/simulate.json", json.dumps(result, indent=2, default=str) + "\n")
