"""Scheduled delivery against the test bed's PostgreSQL and a real local HTTP receiver: a
restart around the scheduled time sends no duplicate and misses no team; two replicas at once
send each report once; a failed POST is retried on a later call; escaping in Slack blocks."""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from receiver import Receiver, start_receiver
from reportgen import GenJob, store_jobs

from auditor.notify import SlackNotifier, WebhookNotifier, verify_signature
from auditor.notify.http import RetryPolicy
from auditor.reports import Destinations, IsoWeek, ReportOptions, add_report_job, build_trigger, send_due_reports
from auditor.reports.weeks import zone
from auditor.store import Store
from auditor.store.reports import ReportStore

UTC = timezone.utc
TZ = "Europe/Berlin"
TEAMS = ("vision", "llm", "recsys", "research", "infra")
# W43 is the 169-hour week in Berlin; its report is due Monday 2026-10-26 08:00 CET = 07:00 UTC
WEEK = IsoWeek(2026, 43)
WS, WE = WEEK.bounds(zone(TZ))
FIRE = datetime(2026, 10, 26, 7, 0, tzinfo=UTC)
SECRET = "s3cret"
FAST = RetryPolicy(attempts=2, base=0.01, cap=0.02, timeout=5)


class Crash(BaseException):
    """The process dies (not an error the sender would catch)."""


@pytest.fixture
def receiver():
    r = start_receiver()
    yield r
    r.close()


@pytest.fixture
def store(postgres_url: str):
    s = Store.open(postgres_url)
    jobs = []
    for t in TEAMS:
        jobs += [
            GenJob(t, f"{t}-train", WS + timedelta(days=1), 10, 2, "healthy"),
            GenJob(t, f"{t}-spin", WS + timedelta(days=2), 5, 1, "low_sm"),
            GenJob(t, f"{t}-<!channel>", WS + timedelta(days=3), 2, 1, "idle"),
        ]
    store_jobs(s, jobs, now=FIRE)
    yield s
    s.close()


def destinations(r: Receiver, crash_after: int | None = None) -> Destinations:
    count = [0]

    class Crashing:
        def __init__(self, inner: SlackNotifier) -> None:
            self.inner = inner

        def send(self, text: str, blocks: list[dict] | None = None):
            if crash_after is not None and count[0] >= crash_after:
                raise Crash()
            count[0] += 1
            return self.inner.send(text, blocks)

    return Destinations(
        team_slack={t: Crashing(SlackNotifier(f"{r.url}/slack/{t}", retry=FAST)) for t in TEAMS},
        admin_slack=SlackNotifier(f"{r.url}/slack/admins", retry=FAST),
        webhook=WebhookNotifier(f"{r.url}/hook", SECRET, retry=FAST),
    )


def send(store: Store, r: Receiver, now: datetime, holder: str, **kw):
    return send_due_reports(
        store,
        now,
        trigger=build_trigger("0 8 * * 1", TZ),
        destinations=kw.pop("dest", None) or destinations(r),
        options=ReportOptions(timezone=TZ),
        holder=holder,
        **kw,
    )


def slack_counts(r: Receiver) -> Counter:
    return Counter(p.path for p in r.by_path("/slack/"))


def webhook_keys(r: Receiver) -> Counter:
    return Counter(p.json["data"]["key"] for p in r.by_path("/hook"))


def assert_each_once(r: Receiver) -> None:
    assert slack_counts(r) == Counter({f"/slack/{t}": 1 for t in TEAMS + ("admins",)})
    keys = webhook_keys(r)
    assert sorted(keys) == sorted(f"report/*/2026-W43/{t}/webhook" for t in TEAMS + ("*",))
    assert set(keys.values()) == {1}


def test_restart_around_the_scheduled_time(store: Store, receiver: Receiver) -> None:
    # 07:59 CET: the W43 report is not due; the week before was due a week ago (too late to send)
    res = send(store, receiver, FIRE - timedelta(minutes=1), "a")
    assert res.sent == [] and "ago" in res.reason and receiver.posts == []
    # 08:00:30: process A sends two team summaries, then dies right after claiming the third
    with pytest.raises(Crash):
        send(store, receiver, FIRE + timedelta(seconds=30), "a", dest=destinations(receiver, crash_after=2))
    assert len(receiver.by_path("/slack/")) == 2
    # 08:01: B starts and sends everything not yet sent, but not the delivery A still holds
    res = send(store, receiver, FIRE + timedelta(minutes=1), "b")
    assert len(res.skipped) >= 1 and not res.failed
    held = [k for k in res.skipped if k.endswith("/slack") and "/*/" not in k.split("2026-W43")[1]]
    assert len(held) == 3  # two sent by A (skipped as done) and the one A died holding
    # 08:16: A's claim has timed out; C (another restart) sends the last team
    res = send(store, receiver, FIRE + timedelta(minutes=16), "c")
    assert len(res.sent) == 1 and res.sent[0].endswith("/slack")
    assert_each_once(receiver)
    # later calls (every cycle, the next day, another restart) send nothing
    for minutes in (30, 60 * 24, 60 * 24 * 6):
        res = send(store, receiver, FIRE + timedelta(minutes=minutes), f"d{minutes}")
        assert res.sent == [] and res.failed == []
    assert_each_once(receiver)
    rows = ReportStore(store).deliveries(week="2026-W43")
    assert len(rows) == 12 and {r["status"] for r in rows} == {"sent"}
    # the webhook bodies are signed, carry the report and a delivery id stable per key
    for p in receiver.by_path("/hook"):
        assert verify_signature(SECRET, p.body, p.headers["X-Gpu-Auditor-Signature"])
        doc = p.json["data"]["report"]
        assert doc["week"] == "2026-W43" and doc["hours_in_week"] == 169.0
        if p.json["data"]["key"].endswith("/vision/webhook"):
            assert doc["scope"] == "team" and doc["total"]["team"] == "vision" and doc["total"]["jobs"] == 3


def test_two_replicas_at_once_send_each_report_once(store: Store, receiver: Receiver) -> None:
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def replica(name: str) -> None:
        try:
            barrier.wait()
            send(store, receiver, FIRE + timedelta(seconds=5), name)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(f"r{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert_each_once(receiver)


def test_failed_post_is_retried_later_and_slack_text_is_escaped(store: Store, receiver: Receiver) -> None:
    receiver.fail_paths.add("/slack/llm")
    res = send(store, receiver, FIRE + timedelta(minutes=2), "a")
    assert res.failed == ["report/*/2026-W43/llm/slack"]
    receiver.fail_paths.clear()
    res = send(store, receiver, FIRE + timedelta(minutes=20), "b")
    assert res.sent == ["report/*/2026-W43/llm/slack"]
    assert_each_once(receiver)
    # the job named "<!channel>" cannot ping anybody; the numbers are the report's
    (vision,) = [p.json for p in receiver.by_path("/slack/vision")]
    text = json.dumps(vision["blocks"])
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text
    assert vision["blocks"][0]["text"]["text"] == "GPU efficiency 2026-W43 · vision"
    (admins,) = [p.json for p in receiver.by_path("/slack/admins")]
    assert "cluster" in admins["blocks"][0]["text"]["text"]


def test_scheduler_registration() -> None:
    from apscheduler.schedulers.background import BackgroundScheduler

    sched = BackgroundScheduler(timezone="UTC")
    job = add_report_job(sched, build_trigger("0 8 * * 1", TZ), lambda: None)
    sched.start(paused=True)
    try:
        nxt = sched.get_job("weekly-reports").next_run_time
        assert nxt.astimezone(zone(TZ)).strftime("%a %H:%M") == "Mon 08:00"
        assert job.coalesce and job.max_instances == 1
    finally:
        sched.shutdown(wait=False)


# ---------------------------------------------------------------------- no data, no report


def test_a_week_without_data_sends_nothing(postgres_url: str, receiver: Receiver) -> None:
    """Day one: the tool was installed after W43; its first start must not post an all-zero
    report of a week it never saw, to any team or channel, and records nothing."""
    s = Store.open(postgres_url)
    try:
        res = send(s, receiver, FIRE + timedelta(minutes=1), "a")
        assert res.sent == [] and res.failed == [] and "no jobs" in res.reason
        assert receiver.posts == [] and ReportStore(s).deliveries(week="2026-W43") == []
    finally:
        s.close()


def test_only_teams_with_jobs_in_the_week_get_its_report(postgres_url: str, receiver: Receiver) -> None:
    """A team seen only in a trend week (W42) is in no W43 delivery; its W42 figures stay in
    the trend, and the weeks before it read "no data" (null), never 0."""
    s = Store.open(postgres_url)
    try:
        store_jobs(
            s,
            [
                GenJob("vision", "vision-train", WS + timedelta(days=1), 10, 2, "healthy"),
                GenJob("llm", "llm-old", WS - timedelta(days=5), 10, 2, "healthy"),
            ],
            now=FIRE,
        )
        send(s, receiver, FIRE + timedelta(minutes=1), "a")
        assert slack_counts(receiver) == Counter({"/slack/vision": 1, "/slack/admins": 1})
        assert sorted(webhook_keys(receiver)) == ["report/*/2026-W43/*/webhook", "report/*/2026-W43/vision/webhook"]
        (cluster,) = [
            p.json["data"]["report"] for p in receiver.by_path("/hook") if p.json["data"]["key"].endswith("/*/webhook")
        ]
        trend = {p["week"]: p for p in cluster["total"]["trend"]}
        assert trend["2026-W42"]["jobs"] == 1 and trend["2026-W42"]["gpu_hours"] == 20.0
        assert trend["2026-W41"]["jobs"] == 0 and trend["2026-W41"]["gpu_hours"] is None
    finally:
        s.close()


@pytest.mark.parametrize(
    ("now", "due"),
    [
        # Monday 07:59 CET, the day after W43's change from summer time: W43 not yet due
        (FIRE - timedelta(minutes=1), False),
        (FIRE + timedelta(minutes=1), True),  # Monday 08:01 Berlin
        (WE - timedelta(minutes=1), False),  # Sunday 23:59: W42 is due, and it has no data
        (datetime(2026, 10, 26, 8, 1, tzinfo=UTC), True),  # 09:01 CET: still due
    ],
    ids=["mon-0759", "mon-0801", "sun-2359", "mon-0901"],
)
def test_the_operators_report_stage_follows_its_clock(
    postgres_url: str, receiver: Receiver, monkeypatch, now, due
) -> None:
    """The operator's report stage decides from the ``now`` it is given, never the wall clock:
    the same store gives the same answer on any day the suite runs."""
    from auditor.operator_loop.reports import ReportStage
    from auditor.settings import Settings

    monkeypatch.setenv("GPU_AUDITOR_TEST_ADMIN_SLACK", f"{receiver.url}/slack/admins")
    settings = Settings.model_validate(
        {
            "cluster": "c1",
            "reports": {"weekly_schedule": "mon 08:00", "timezone": TZ},
            "notifications": {"slack": {"webhook_url_env": "GPU_AUDITOR_TEST_ADMIN_SLACK"}},
        }
    )
    s = Store.open(postgres_url)
    try:
        store_jobs(s, [GenJob("vision", "vision-train", WS + timedelta(days=1), 10, 2, "healthy")], now=FIRE)
        stage = ReportStage(settings, s)
        stage.send(now=now)
        stage.send(now=now + timedelta(seconds=30))  # the next cycle repeats nothing
        assert slack_counts(receiver) == (Counter({"/slack/admins": 1}) if due else Counter())
    finally:
        s.close()
