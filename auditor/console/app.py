"""The console as one request handler, independent of the HTTP server that mounts it.

:meth:`ConsoleApp.handle` takes (method, path below the mount point, query, headers, body) and
returns a :class:`Response`; the operator's health server and ``gpu-auditor console`` both mount
it (:mod:`auditor.operator_loop.health`). Reads only, unless ``writes`` is on: then the job page
offers acknowledging and snoozing its lineage, a ``POST`` to ``ack`` with a form token, recorded
through the same :class:`~auditor.console.ports.AckWriter` as ``gpu-auditor ack`` with who did it.

Who did it is the user an authenticating proxy in front names (``X-Forwarded-User``,
``X-Forwarded-Email``, oauth2-proxy's ``X-Auth-Request-*``), else ``console``: the console does
no authentication itself (docs/console.md). The form token is an HMAC of that user under a
per-process secret: a page of another site cannot read it, so it cannot post on a user's
behalf (CSRF), and a token is good only for the user it was issued to.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from auditor.console import pages
from auditor.console.pages import Step, Writes
from auditor.console.ports import SORT_KEYS, AckWriter, ConsoleReader, JobDetail, JobFilter
from auditor.core.acklink import DEFAULT_SNOOZE
from auditor.core.gate import AckKind, GateDecision, GateMode, GateRule, LineageHistory, decide
from auditor.core.identity import JobKey
from auditor.core.job_snooze import in_force
from auditor.core.lineage import LineageKey
from auditor.errors import AuditorError, BadInput
from auditor.timeparse import parse_duration

log = logging.getLogger(__name__)

#: headers an authenticating proxy sets to the signed-in user, first present wins
USER_HEADERS = ("x-forwarded-user", "x-forwarded-email", "x-auth-request-user", "x-auth-request-email")
#: the largest page of the job list (all of a 10,000-job store on one page)
MAX_LIMIT = 10_000
_STATIC = {"console.css": "text/css; charset=utf-8", "console.js": "text/javascript; charset=utf-8"}
_HTML = "text/html; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ConsoleConfig:
    """What the pages need besides the store: writes, prices, the loaded policies and gate rules."""

    base: str = "/console"
    writes: bool = False
    prices: Mapping[str, float] = field(default_factory=dict)
    currency: str = "USD"
    ladders: Mapping[str, Sequence[Step]] = field(default_factory=dict)
    gate_rules: Sequence[GateRule] = ()
    gate_mode: GateMode = GateMode.OBSERVE
    #: whether the operator runs the gate (``gate.enabled``); off, the page says what its rules would do
    gate_enabled: bool = False
    #: a job without an end seen within this long counts as running
    running_within: timedelta = timedelta(minutes=15)
    weeks: int = 8


def _one(q: Mapping[str, list[str]], name: str, default: str = "") -> str:
    return (q.get(name) or [default])[0].strip()


def _int(q: Mapping[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    text = _one(q, name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadInput(f"{name}: {text!r} is not a whole number") from None
    if not low <= value <= high:
        raise BadInput(f"{name}: {value} is not within {low}..{high}")
    return value


def job_filter(query: str) -> JobFilter:
    """The job list's filter from its query string (BadInput naming the bad parameter)."""
    q = parse_qs(query, keep_blank_values=False)
    sort = _one(q, "sort", "waste_gpu_hours")
    if sort not in SORT_KEYS:
        raise BadInput(f"sort: {sort!r} is not one of {', '.join(SORT_KEYS)}")
    state = _one(q, "state")
    if state not in ("", "running", "ended"):
        raise BadInput(f"state: {state!r} is not running or ended")
    return JobFilter(
        team=_one(q, "team"),
        namespace=_one(q, "namespace"),
        verdict=_one(q, "verdict"),
        text=_one(q, "q")[:200],
        state=state,
        sort=sort,
        descending=_one(q, "desc", "1") != "0",
        offset=_int(q, "offset", 0, 0, 10**9),
        limit=_int(q, "limit", 100, 1, MAX_LIMIT),
    )


def iso_weeks(now: datetime, n: int) -> list[tuple[str, datetime, datetime]]:
    """The ``n`` UTC ISO weeks up to the one holding ``now``, oldest first: (label, start, end)."""
    monday = (now - timedelta(days=now.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
    out = []
    for i in range(n - 1, -1, -1):
        start = monday - timedelta(weeks=i)
        year, week, _ = start.isocalendar()
        out.append((f"{year}-W{week:02d}", start, start + timedelta(weeks=1)))
    return out


def user_of(headers: Mapping[str, str]) -> str:
    """The user the proxy in front names, printable and at most 200 characters; else ``console``."""
    lower = {k.lower(): v for k, v in headers.items()}
    for h in USER_HEADERS:
        value = "".join(c for c in (lower.get(h) or "") if c.isprintable()).strip()
        if value:
            return value[:200]
    return "console"


class ConsoleApp:
    """Routes a request below the mount point to its page."""

    def __init__(
        self,
        reader: ConsoleReader,
        clock: Callable[[], datetime],
        config: ConsoleConfig | None = None,
        *,
        acks: AckWriter | None = None,
        secret: bytes | None = None,
        snoozes: Any = None,
    ) -> None:
        self.reader = reader
        self.clock = clock
        self.config = config or ConsoleConfig()
        if self.config.writes and acks is None:
            raise ValueError("console writes need an acknowledgement log")
        self.acks = acks
        #: the paused escalation ladders (:class:`auditor.store.job_snoozes.JobSnoozeLog`, issue 30):
        #: the job page shows a job's snooze, and with writes snoozes it; None: neither
        self.snoozes = snoozes
        self._secret = secret or secrets.token_bytes(32)

    # ------------------------------------------------------------------ HTTP

    def mount(
        self, method: str, path: str, query: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, str, bytes, Mapping[str, str]]:
        """:meth:`handle` as the health server's mount signature."""
        r = self.handle(method, path, query, headers, body)
        return r.status, r.content_type, r.body, r.headers

    def handle(self, method: str, path: str, query: str, headers: Mapping[str, str], body: bytes) -> Response:
        try:
            return self._route(method, path.strip("/"), query, headers, body)
        except BadInput as exc:
            return self._page(400, "Bad request", pages.error(str(exc)), "")
        except AuditorError as exc:
            log.warning("console: %s %s: %s", method, path, exc)
            return self._page(503, "Store unavailable", pages.error(str(exc)), "")

    def _route(self, method: str, path: str, query: str, headers: Mapping[str, str], body: bytes) -> Response:
        if path.startswith("static/"):
            return self._static(path.removeprefix("static/"))
        if method == "POST":
            if path != "ack":
                return Response(405, "text/plain; charset=utf-8", b"method not allowed\n")
            return self._ack(headers, body)
        if method != "GET":
            return Response(405, "text/plain; charset=utf-8", b"method not allowed\n")
        now = self.clock()
        if path == "":
            weeks = iso_weeks(now, 1)
            c = self.reader.cluster_now(
                now, recent=self.config.running_within.total_seconds(), since=now - timedelta(days=7)
            )
            body_html = pages.cluster(
                self.config.base, c, self.reader.team_weeks(weeks, dict(self.config.prices)), weeks[-1][0]
            )
            return self._page(200, "Cluster now", body_html, "")
        if path == "teams":
            weeks = iso_weeks(now, self.config.weeks)
            rows = self.reader.team_weeks(weeks, dict(self.config.prices))
            body_html = pages.teams(self.config.base, rows, [w[0] for w in weeks], self.config.currency)
            return self._page(200, "Teams", body_html, "teams")
        if path == "jobs":
            f = replace(job_filter(query), running_since=now - self.config.running_within)
            return self._page(200, "Jobs", pages.jobs(self.config.base, self.reader.jobs(f), f), "jobs")
        if path.startswith("jobs/"):
            return self._job(path.removeprefix("jobs/"), headers, now)
        if path == "policy":
            body_html = pages.policy(
                self.config.base,
                self.reader.open_violations(),
                self.config.ladders,
                self.reader.actions(now - timedelta(days=7)),
                now,
            )
            return self._page(200, "Policy ladder", body_html, "policy")
        if path == "gate":
            histories = self.reader.lineages(now - timedelta(days=30))
            decisions = {(h.key.cluster, h.key.namespace, h.key.lineage): self._decide(h, now) for h in histories}
            body_html = pages.gate(
                self.config.base,
                histories,
                decisions,
                now,
                rules=len(self.config.gate_rules),
                on=self.config.gate_enabled,
            )
            return self._page(200, "Efficiency gate", body_html, "gate")
        if path == "deliveries":
            since = iso_weeks(now, 5)[0][0]
            alerts = [a for a in self.reader.actions(now - timedelta(days=7)) if a.action == "notify"]
            return self._page(
                200,
                "Deliveries",
                pages.deliveries(self.config.base, self.reader.deliveries(since), alerts),
                "deliveries",
            )
        return self._page(404, "Not found", pages.error(f"no page {path!r}"), "")

    def _decide(self, h: LineageHistory, now: datetime) -> GateDecision | None:
        """What the loaded gate rules decide for the lineage's next submission (None: no rules)."""
        if not self.config.gate_rules:
            return None
        return decide(h, self.config.gate_rules, self.config.gate_mode, now)

    def _job(self, ident: str, headers: Mapping[str, str], now: datetime) -> Response:
        if not ident.isdigit():
            raise BadInput(f"job id {ident!r} is not a number")
        d = self.reader.job(int(ident), now)
        if d is None:
            return self._page(404, "Not found", pages.error(f"no job {ident} in the store"), "jobs")
        if d.row.running and (d.last_seen is None or d.last_seen < now - self.config.running_within):
            # running as the cluster page and the job list count it: not ended and seen lately
            d = replace(d, row=d.row._replace(running=False))
        writes = None
        if self.config.writes:
            user = user_of(headers)
            writes = Writes(self.token(user), user)
        title = f"{d.row.namespace}/{d.row.kind}/{d.row.name}"
        paused = None
        if self.snoozes is not None:
            paused = in_force(self.snoozes.of_job(_job_key(d)), now).get(_job_key(d))
        return self._page(200, title, pages.job(self.config.base, d, writes, paused=paused), "jobs")

    def token(self, user: str) -> str:
        """The form token of ``user`` (constant for the process's life)."""
        return hmac.new(self._secret, f"ack\0{user}".encode(), hashlib.sha256).hexdigest()

    def _ack(self, headers: Mapping[str, str], body: bytes) -> Response:
        if not self.config.writes or self.acks is None:
            return self._page(403, "Read-only", pages.error("this console is read-only (writes are not enabled)"), "")
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        user = user_of(headers)
        if not hmac.compare_digest(_one(form, "csrf"), self.token(user)):
            return self._page(
                403, "Forbidden", pages.error("the form token is missing or not this user's: reload the page"), ""
            )
        now = self.clock()
        if _one(form, "kind") == "job-snooze":
            return self._snooze_job(_one(form, "job"), user, _one(form, "reason")[:500], now)
        key = LineageKey.parse(_one(form, "lineage"), cluster=_one(form, "cluster") or "default", what="lineage")
        kind = AckKind.SNOOZE if _one(form, "kind") == "snooze" else AckKind.ACK
        until_text = _one(form, "until")
        until = now + parse_duration(until_text, what="until") if until_text else None
        self.acks.acknowledge(key, user, until, _one(form, "reason")[:500], now, via="console", kind=kind)
        log.info("console: %s %s %s until %s", user, kind.value, key, until)
        job = _one(form, "job")
        where = f"{self.config.base}/jobs/{job}" if job.isdigit() else f"{self.config.base}/gate"
        return Response(303, "text/plain; charset=utf-8", b"recorded\n", {"Location": where})

    def _snooze_job(self, ident: str, user: str, reason: str, now: datetime) -> Response:
        """The job page's "Snooze this job's escalation" (issue 30): pauses the job's policy ladder
        for :data:`~auditor.core.acklink.DEFAULT_SNOOZE`, recorded as the alert's link records it."""
        if self.snoozes is None:
            return self._page(403, "Read-only", pages.error("this console cannot record snoozes"), "")
        d = self.reader.job(int(ident), now) if ident.isdigit() else None
        if d is None:
            raise BadInput(f"no job {ident!r} in the store")
        self.snoozes.snooze(_job_key(d), user, now + DEFAULT_SNOOZE, reason, now, via="console")
        log.info("console: %s snoozed the escalation of %s for %s", user, _job_key(d), DEFAULT_SNOOZE)
        return Response(
            303, "text/plain; charset=utf-8", b"recorded\n", {"Location": f"{self.config.base}/jobs/{ident}"}
        )

    def _static(self, name: str) -> Response:
        ctype = _STATIC.get(name)
        if ctype is None:
            return Response(404, "text/plain; charset=utf-8", b"not found\n")
        data = resources.files("auditor.console").joinpath("static", name).read_bytes()
        return Response(200, ctype, data, {"Cache-Control": "max-age=300"})

    def _page(self, status: int, title: str, body_html: str, active: str) -> Response:
        text = pages.layout(self.config.base, active, title, body_html, self.clock(), writes=self.config.writes)
        return Response(status, _HTML, text.encode("utf-8"))


def _job_key(d: JobDetail) -> JobKey:
    return JobKey(d.row.cluster, d.row.namespace, d.row.kind, d.row.name)
