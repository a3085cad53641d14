"""When weekly reports go out, and sending each exactly once per team, week and channel.

The schedule is an apscheduler 3.x :class:`CronTrigger` in the report time zone (DST-safe: a
Monday 08:00 Europe/Berlin report fires at 08:00 local time in summer and in winter). Firing
is only a nudge: what is *due* is decided from the trigger and ``now`` alone —the latest fire
time at or before ``now`` makes the last ISO week that had ended by then due— and what was
*sent* is remembered in the store (``report_deliveries``, migration 0003). So:

- a restart (or a leader change) around the scheduled time neither skips nor repeats a team:
  the operator calls :func:`send_due_reports` at start-up and on every cycle, and every call
  sends exactly the deliveries that are due and not yet in the ledger;
- two replicas calling at once cannot both send: each delivery is *claimed* (a row inserted
  under a unique key) before its message is posted;
- a sender that dies between claiming and recording the outcome leaves a ``claimed`` row;
  after ``claim_timeout`` another sender takes it over. If the death came after the POST
  succeeded, that one message goes out twice: the only duplicate possible. The webhook's
  delivery id is the ledger key, so a webhook receiver can drop it; Slack cannot.
- a failed POST (after the notifier's own retries, all within ``notifications.deadline``) is
  recorded ``failed`` and retried on a later call, up to ``max_attempts`` claims in all; a Slack
  POST that got no answer may have posted the report (Slack takes no idempotency key): it is
  recorded ``unconfirmed`` and never sent again.
- the operator sends from its delivery job, beside the cycles, never inside one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, Protocol

from apscheduler.triggers.cron import CronTrigger

from auditor.errors import BadInput
from auditor.reports.aggregate import ALL_TEAMS, team_view
from auditor.reports.service import ReportOptions, generate
from auditor.reports.slack import cluster_message, team_message
from auditor.reports.weeks import IsoWeek, last_complete_week, zone
from auditor.store.reports import ReportStore
from auditor.store.store import Store

log = logging.getLogger(__name__)

DEFAULT_SCHEDULE = "0 8 * * 1"  # Mondays 08:00
WEBHOOK_KIND = "weekly_report"
_DOW_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")


# ---------------------------------------------------------------------- schedule


def _crontab_dow(field_text: str) -> str:
    """Crontab day-of-week numbers (0 or 7 = Sunday, 1 = Monday) → names.

    apscheduler 3.x numbers days from Monday = 0, and ``CronTrigger.from_crontab`` passes the
    numbers through, so ``0 8 * * 1`` would fire on *Tuesdays*. Names mean the same to both.
    """

    def one(m: re.Match[str]) -> str:
        n = int(m.group(0))
        if not 0 <= n <= 7:
            raise BadInput(f"day of week {n} is out of range 0-7 in cron field {field_text!r}")
        return _DOW_NAMES[n]

    out = []
    for part in field_text.split(","):
        base, slash, step = part.partition("/")
        out.append(re.sub(r"\d+", one, base) + (slash + step if slash else ""))
    return ",".join(out)


def build_trigger(schedule: str = DEFAULT_SCHEDULE, timezone_name: str = "UTC") -> CronTrigger:
    """The report trigger: a 5-field crontab line (minute hour day month day-of-week, with
    crontab's day numbers) or ``"<day> HH:MM"`` (``"mon 08:00"``), in ``timezone_name``."""
    tz = zone(timezone_name)
    text = (schedule or "").strip()
    m = re.match(r"^([A-Za-z]{3})[a-z]*\s+(\d{1,2}):(\d{2})$", text)
    try:
        if m:
            return CronTrigger(
                day_of_week=m.group(1).lower(), hour=int(m.group(2)), minute=int(m.group(3)), timezone=tz
            )
        parts = text.split()
        if len(parts) != 5:
            raise ValueError("expected 5 fields (minute hour day month day-of-week) or 'mon 08:00'")
        minute, hour, day, month, dow = parts
        return CronTrigger(minute=minute, hour=hour, day=day, month=month, day_of_week=_crontab_dow(dow), timezone=tz)
    except (ValueError, TypeError) as exc:
        raise BadInput(f"reports schedule {schedule!r}: {exc}") from None


def latest_fire(trigger: CronTrigger, now: datetime, *, lookback: timedelta = timedelta(days=8)) -> datetime | None:
    """The trigger's latest fire time at or before ``now`` (within ``lookback``), in UTC."""
    t = now - lookback
    last: datetime | None = None
    prev: datetime | None = None
    for _ in range(100_000):
        nxt = trigger.get_next_fire_time(prev, t)
        if nxt is None or nxt > now:
            break
        last = prev = nxt
        t = nxt + timedelta(microseconds=1)
    return None if last is None else last.astimezone(timezone.utc)


def due_week(trigger: CronTrigger, now: datetime, timezone_name: str = "UTC") -> tuple[IsoWeek, datetime] | None:
    """(the week due for sending, the fire time that made it due), or None before the first
    fire time. The week is the last ISO week that had ended at that fire time."""
    fired = latest_fire(trigger, now)
    if fired is None:
        return None
    return last_complete_week(fired, zone(timezone_name)), fired


def add_report_job(
    scheduler: Any, trigger: CronTrigger, func: Callable[[], Any], *, job_id: str = "weekly-reports"
) -> Any:
    """Register ``func`` (a closure calling :func:`send_due_reports`) on an apscheduler 3.x
    scheduler: one instance at a time, missed runs coalesced (the ledger makes re-runs safe)."""
    return scheduler.add_job(
        func, trigger, id=job_id, replace_existing=True, coalesce=True, max_instances=1, misfire_grace_time=6 * 3600
    )


# ---------------------------------------------------------------------- destinations


class SlackLike(Protocol):
    def send(self, text: str, blocks: list[dict] | None = None) -> Any: ...


class WebhookLike(Protocol):
    def send(self, kind: str, payload: dict, *, delivery_id: str | None = None) -> Any: ...


@dataclass
class Destinations:
    """Where reports go: each team's Slack channel, the admins' channel (the cluster-wide
    summary), and the generic webhook (every team's report and the cluster's)."""

    team_slack: Mapping[str, SlackLike] = field(default_factory=dict)
    admin_slack: SlackLike | None = None
    webhook: WebhookLike | None = None

    @classmethod
    def from_settings(cls, notifications: Any, environ: Mapping[str, str] | None = None) -> "Destinations":
        """From the operator's ``notifications`` settings: ``slack.webhook_url_env`` is the
        admins' channel, ``routes.<team>.slack_webhook_url_env`` a team's channel, and
        ``webhook.url_env`` + ``webhook.hmac_key_env`` the generic webhook. Unset variables
        leave that destination out."""
        from auditor.notify import RetryPolicy, SlackNotifier, WebhookNotifier

        env = os.environ if environ is None else environ
        timeout, deadline = getattr(notifications, "timeout", None), getattr(notifications, "deadline", None)
        retry = RetryPolicy(
            **({"timeout": timeout.total_seconds()} if timeout else {}),
            **({"deadline": deadline.total_seconds()} if deadline else {}),
        )

        def var(name: str | None) -> str | None:
            return env.get(name) or None if name else None

        admin = var(getattr(getattr(notifications, "slack", None), "webhook_url_env", None))
        teams: dict[str, SlackLike] = {}
        for team, route in (getattr(notifications, "routes", None) or {}).items():
            url = var(getattr(route, "slack_webhook_url_env", None))
            if url:
                teams[str(team)] = SlackNotifier(url, retry=retry)
        wh = getattr(notifications, "webhook", None)
        wh_url, wh_key = var(getattr(wh, "url_env", None)), var(getattr(wh, "hmac_key_env", None))
        return cls(
            team_slack=teams,
            admin_slack=SlackNotifier(admin, retry=retry) if admin else None,
            webhook=WebhookNotifier(wh_url, wh_key, retry=retry) if wh_url and wh_key else None,
        )


# ---------------------------------------------------------------------- sending


@dataclass
class SendResult:
    """What one :func:`send_due_reports` call did."""

    week: str | None = None
    sent: list[str] = field(default_factory=list)  # dedup keys
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # already sent, or held by another sender
    reason: str = ""


def dedup_key(cluster: str, week: str, team: str, channel: str) -> str:
    return f"report/{cluster}/{week}/{team}/{channel}"


def _delivery_id(key: str) -> str:
    """A stable UUID from the ledger key: the same report always carries the same id."""
    return str(uuid.UUID(hashlib.sha256(key.encode()).hexdigest()[:32]))


def default_holder() -> str:
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


def _ok(result: Any) -> tuple[bool, str | None, dict]:
    """Interpret a notifier's answer (a Delivery; None or True from simple senders is ok)."""
    if result is None or result is True:
        return True, None, {}
    ok = bool(getattr(result, "ok", result))
    detail = result.as_dict() if hasattr(result, "as_dict") else {}
    return ok, getattr(result, "error", None) if not ok else None, detail


def send_due_reports(
    store: Store,
    now: datetime,
    *,
    trigger: CronTrigger,
    destinations: Destinations,
    options: ReportOptions | None = None,
    holder: str | None = None,
    claim_timeout: timedelta = timedelta(minutes=15),
    max_attempts: int = 5,
    max_lateness: timedelta | None = timedelta(days=3),
) -> SendResult:
    """Send every report delivery that is due at ``now`` and not yet sent; see the module
    docstring for the guarantees. Cheap when nothing is due (a ledger read)."""
    opts = options or ReportOptions()
    due = due_week(trigger, now, opts.timezone)
    if due is None:
        return SendResult(reason="no scheduled time has passed yet")
    week, fired = due
    if max_lateness is not None and now - fired > max_lateness:
        return SendResult(
            week=str(week), reason=f"the {week} report was due at {fired.isoformat()}, more than {max_lateness} ago"
        )
    rs = ReportStore(store)
    cluster = opts.cluster or ALL_TEAMS
    tz = zone(opts.timezone)
    start, end = week.bounds(tz)
    teams = sorted(
        set(rs.teams(week.shift(-opts.trend_weeks).bounds(tz)[0], end, cluster=opts.cluster)) | set(opts.teams)
    )
    wanted: list[tuple[str, str]] = []  # (team, channel)
    for t in teams:
        if t in destinations.team_slack:
            wanted.append((t, "slack"))
        if destinations.webhook is not None:
            wanted.append((t, "webhook"))
    if destinations.admin_slack is not None:
        wanted.append((ALL_TEAMS, "slack"))
    if destinations.webhook is not None:
        wanted.append((ALL_TEAMS, "webhook"))
    result = SendResult(week=str(week))
    done = {
        r["dedup_key"] for r in rs.deliveries(cluster=cluster, week=str(week)) if r["status"] in ("sent", "unconfirmed")
    }
    pending = [(t, c) for t, c in wanted if dedup_key(cluster, str(week), t, c) not in done]
    result.skipped.extend(dedup_key(cluster, str(week), t, c) for t, c in wanted if (t, c) not in pending)
    if not pending:
        result.reason = "nothing left to send"
        return result
    report = generate(store, week, now=now, options=opts)
    # Only teams with jobs in the week (and those the admin listed in ``reports.teams``) get
    # its report, and nothing goes out for a week in which the cluster recorded no job: a week
    # without data (before the tool ran) is no news, and an all-zero report of it reads as
    # "0 GPU-hours used". Nothing is claimed, so data that arrives late (a backfilled audit)
    # still gets the report while it is due.
    with_jobs = {t["team"] for t in report["teams"] if t["jobs"]} | set(opts.teams)
    if not report["total"]["jobs"]:
        result.reason = f"no jobs were recorded in {week}: nothing to report"
        return result
    me = holder or default_holder()
    for team, channel in pending:
        key = dedup_key(cluster, str(week), team, channel)
        if team != ALL_TEAMS and team not in with_jobs:
            continue
        if not rs.claim(
            dedup_key=key,
            cluster=cluster,
            week=str(week),
            team=team,
            channel=channel,
            now=now,
            holder=me,
            claim_timeout=claim_timeout,
            max_attempts=max_attempts,
        ):
            result.skipped.append(key)
            continue
        try:
            if channel == "slack":
                text, blocks = (
                    cluster_message(report)
                    if team == ALL_TEAMS
                    else team_message(report, team_view(report, team)["total"])
                )
                sender = destinations.admin_slack if team == ALL_TEAMS else destinations.team_slack[team]
                answer = sender.send(text, blocks)  # type: ignore[union-attr]
            else:
                doc = report if team == ALL_TEAMS else team_view(report, team)
                answer = destinations.webhook.send(  # type: ignore[union-attr]
                    WEBHOOK_KIND, {"key": key, "report": doc}, delivery_id=_delivery_id(key)
                )
            ok, error, detail = _ok(answer)
        except Exception as exc:  # noqa: BLE001 - one failed delivery must not stop the others
            ok, error, detail = False, f"{type(exc).__name__}: {exc}", {}
        unconfirmed = bool(detail.get("unconfirmed"))
        rs.finish(key, ok=ok, now=now, holder=me, error=error, detail=detail, unconfirmed=unconfirmed)
        (result.sent if ok else result.failed).append(key)
        if not ok:
            log.warning("weekly report %s not delivered: %s", key, error)
    return result
