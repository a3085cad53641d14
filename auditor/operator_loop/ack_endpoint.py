"""``/gate/ack`` on the operator's HTTP server: the signed links of an alert's two buttons.

``GET`` (the click in Slack, or a chat app's link preview) only checks the link and shows what it
would do, with a button; ``POST`` (the button) records it. Preview bots fetch links with GET, so
a GET that acted would spend single-use links nobody clicked. Two actions (issue 30), one path
(the chart's ingress routes it already):

- ``ack`` — "Acknowledge for re-submission (gate)": recorded in the store's
  :class:`~auditor.store.lineage.AckLog`; the gate lets the lineage's next submissions through.
- ``snooze`` — "Snooze this job's escalation": recorded in the store's
  :class:`~auditor.store.job_snoozes.JobSnoozeLog` from the click for the link's duration; the
  policy runner takes no step on the running job meanwhile.

Both with ``via=link``, ``by=link:<recipient>`` and the link's nonce as its id: a second POST is
refused.
"""

from __future__ import annotations

import html
import logging
from datetime import datetime
from typing import Callable, Protocol
from urllib.parse import parse_qs

from auditor.core.acklink import ACK_LABEL, AckLink, LinkRefused, SnoozeLink, hours_text, snooze_label, verify
from auditor.core.identity import JobKey
from auditor.core.lineage import LineageKey
from auditor.errors import AuditorError, BadInput
from auditor.policy.config import read_link_key as read_link_key  # re-exported

log = logging.getLogger(__name__)

PATH = "/gate/ack"
#: a form of a link's fields is a few hundred bytes
MAX_BODY = 16 * 1024
HTML = "text/html; charset=utf-8"

Response = tuple[int, str, bytes]


class AckStore(Protocol):
    """What the endpoint needs of :class:`auditor.store.lineage.AckLog`."""

    def acknowledge(
        self,
        key: LineageKey,
        by: str,
        until: datetime | None,
        reason: str,
        now: datetime,
        *,
        via: str = ...,
        link_id: str | None = ...,
    ) -> object: ...

    def link_used(self, link_id: str) -> bool: ...


class SnoozeStore(Protocol):
    """What the endpoint needs of :class:`auditor.store.job_snoozes.JobSnoozeLog`."""

    def snooze(
        self,
        job: JobKey,
        by: str,
        until: datetime,
        reason: str,
        now: datetime,
        *,
        via: str = ...,
        link_id: str | None = ...,
    ) -> object: ...

    def link_used(self, link_id: str) -> bool: ...


class AckEndpoint:
    """Checks and redeems signed links for ``cluster`` (a link for another cluster is refused).
    ``snoozes`` None: snooze links are answered 503 (this operator cannot record them)."""

    def __init__(
        self,
        acks: AckStore,
        key: bytes,
        *,
        cluster: str,
        clock: Callable[[], datetime],
        snoozes: SnoozeStore | None = None,
    ) -> None:
        self.acks = acks
        self.key = key
        self.cluster = cluster
        self.clock = clock
        self.snoozes = snoozes

    def handle(self, method: str, query: str, body: bytes) -> Response:
        """One request: GET shows the confirmation, POST acknowledges."""
        if method == "POST":
            if len(body) > MAX_BODY:
                return _page(413, "Too large", "This is not an acknowledgement form.")
            params = _params(body.decode("utf-8", "replace"))
        elif method == "GET":
            params = _params(query)
        else:
            return _page(405, "Not allowed", "Use the link from the alert.")
        now = self.clock()
        try:
            link = verify(params, self.key, now)
            cluster = link.job.cluster if isinstance(link, SnoozeLink) else link.key.cluster
            if cluster != self.cluster:
                raise LinkRefused(f"the link is for cluster {cluster}, this operator audits {self.cluster}")
        except LinkRefused as exc:
            log.warning("gate: refused an acknowledgement link: %s", exc)
            return _page(403, "Link refused", str(exc))
        if isinstance(link, SnoozeLink):
            return self._snooze(method, link, params, now)
        ack = link
        failed = _redeem(
            method,
            lambda: self.acks.link_used(ack.nonce),
            lambda: _confirm(ack, params),
            lambda: self.acks.acknowledge(
                ack.key,
                f"link:{ack.to}",
                ack.until,
                "acknowledged through a signed link",
                now,
                via="link",
                link_id=ack.nonce,
            ),
            ("acknowledges", "acknowledgement", f"gate: could not record an acknowledgement of {ack.key}"),
        )
        if failed is not None:
            return failed
        log.info("gate: %s acknowledged through a signed link sent to %s", link.key, link.to)
        until = f" until {_iso(link.until)}" if link.until else ""
        return _page(
            200,
            "Acknowledged",
            f"Lineage {link.key} is acknowledged{until}: its held submissions are released and the runs so far "
            "no longer hold new ones.",
        )

    def _snooze(self, method: str, link: SnoozeLink, params: dict[str, str], now: datetime) -> Response:
        """A snooze link: GET confirms, POST pauses the job's ladder from now for the link's duration."""
        if self.snoozes is None:
            return _page(503, "Snooze unavailable", "This operator cannot record snoozes; try again later.")
        snoozes, until = self.snoozes, now + link.duration
        failed = _redeem(
            method,
            lambda: snoozes.link_used(link.nonce),
            lambda: _confirm_snooze(link, params),
            lambda: snoozes.snooze(
                link.job,
                f"link:{link.to}",
                until,
                "snoozed through a signed link",
                now,
                via="link",
                link_id=link.nonce,
            ),
            ("snoozes", "snooze", f"policies: could not record a snooze of {link.job}"),
        )
        if failed is not None:
            return failed
        log.info("policies: %s snoozed until %s through a signed link sent to %s", link.job, _iso(until), link.to)
        return _page(
            200,
            "Snoozed",
            f"The escalation of job {link.job.namespace}/{link.job.job} is paused until {_iso(until)}: no alert "
            "again, no annotation, Event or requeue until then; then it goes on where it was. This does not "
            "acknowledge the job's lineage for the gate.",
        )


def _redeem(
    method: str,
    used: Callable[[], bool],
    confirm: Callable[[], Response],
    record: Callable[[], object],
    words: tuple[str, str, str],
) -> Response | None:
    """The shared steps of both links: a used link is 409, a GET only confirms, a POST records;
    None when recorded. ``words``: what a link does (``acknowledges``), what it records
    (``acknowledgement``), and the log line when the store fails."""
    does, noun, failure = words
    try:
        if used():
            return _page(409, "Already used", f"This link was used before: a link {does} once.")
        if method == "GET":
            return confirm()
        record()
    except BadInput as exc:
        already = "already used" in str(exc)
        return _page(409 if already else 400, "Already used" if already else "Not recorded", str(exc))
    except AuditorError as exc:
        log.error("%s: %s", failure, exc)
        return _page(503, "Try again", f"The {noun} could not be recorded; try again in a minute.")
    return None


def without_key(why: str) -> Callable[[str, str, bytes], Response]:
    """The endpoint when the link key cannot be read (a Secret missing or too short): every link is
    answered 503 with why, instead of the operator failing to start over an optional feature."""

    def handle(method: str, query: str, body: bytes) -> Response:
        return _page(
            503,
            "Links unavailable",
            f"Acknowledgement links are not available on this operator: {why}. "
            "Acknowledge with `gpu-auditor ack NAMESPACE/LINEAGE` instead.",
        )

    return handle


def _params(text: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(text, keep_blank_values=False, max_num_fields=32).items()}


def _iso(t: datetime | None) -> str:
    return t.isoformat().replace("+00:00", "Z") if t else ""


def _form(params: dict[str, str], label: str) -> str:
    """The confirmation's form: the link's fields again, POSTed by the one button."""
    hidden = "".join(
        f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in sorted(params.items())
    )
    return f'<form method="post" action="/gate/ack">{hidden}<button type="submit">{html.escape(label)}</button></form>'


def _confirm(link: AckLink, params: dict[str, str]) -> Response:
    until = f" until {_iso(link.until)}" if link.until else ""
    text = (
        f"Acknowledge lineage <b>{html.escape(str(link.key))}</b> (cluster {html.escape(link.key.cluster)}){until}? "
        "Its held submissions are released, and its runs so far no longer hold new ones. This does not pause "
        "the running job's escalation."
    )
    return _page(200, "Acknowledge", text, raw=_form(params, ACK_LABEL))


def _confirm_snooze(link: SnoozeLink, params: dict[str, str]) -> Response:
    label = snooze_label(link.duration)
    text = (
        f"{html.escape(label)}: job <b>{html.escape(link.job.namespace + '/' + link.job.job)}</b> (cluster "
        f"{html.escape(link.job.cluster)})? For {html.escape(hours_text(link.duration))} from now its policies take "
        "no step (no alert again, no annotation, Event or requeue); then its escalation goes on where it was. "
        "The job's lineage is not acknowledged for the gate."
    )
    return _page(200, "Snooze", text, raw=_form(params, label))


def _page(code: int, title: str, text: str, *, raw: str = "") -> Response:
    body = (
        "<!doctype html><html><head><meta charset='utf-8'><title>gpu-auditor: "
        f"{html.escape(title)}</title></head><body><h1>{html.escape(title)}</h1><p>"
        f"{text if raw else html.escape(text)}</p>{raw}</body></html>\n"
    )
    return code, HTML, body.encode()
