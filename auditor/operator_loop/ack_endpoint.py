"""``/gate/ack`` on the operator's HTTP server: acknowledge a lineage through a signed link.

``GET`` (the click in Slack, or a chat app's link preview) only checks the link and shows what it
would do, with a button; ``POST`` (the button) records the acknowledgement. Preview bots fetch
links with GET, so a GET that acknowledged would spend single-use links nobody clicked. The
acknowledgement is recorded in the store's :class:`~auditor.store.lineage.AckLog` with
``via=link``, ``by=link:<recipient>`` and the link's nonce as its id: a second POST is refused.
"""

from __future__ import annotations

import html
import logging
from datetime import datetime
from typing import Callable, Protocol
from urllib.parse import parse_qs

from auditor.core.acklink import AckLink, LinkRefused, verify
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


class AckEndpoint:
    """Checks and redeems signed links for ``cluster`` (a link for another cluster is refused)."""

    def __init__(self, acks: AckStore, key: bytes, *, cluster: str, clock: Callable[[], datetime]) -> None:
        self.acks = acks
        self.key = key
        self.cluster = cluster
        self.clock = clock

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
            if link.key.cluster != self.cluster:
                raise LinkRefused(f"the link is for cluster {link.key.cluster}, this operator audits {self.cluster}")
        except LinkRefused as exc:
            log.warning("gate: refused an acknowledgement link: %s", exc)
            return _page(403, "Link refused", str(exc))
        try:
            if self.acks.link_used(link.nonce):
                return _page(409, "Already used", "This link was used before: a link acknowledges once.")
            if method == "GET":
                return _confirm(link, params)
            self.acks.acknowledge(
                link.key,
                f"link:{link.to}",
                link.until,
                "acknowledged through a signed link",
                now,
                via="link",
                link_id=link.nonce,
            )
        except BadInput as exc:
            already = "already used" in str(exc)
            return _page(409 if already else 400, "Already used" if already else "Not recorded", str(exc))
        except AuditorError as exc:
            log.error("gate: could not record an acknowledgement of %s: %s", link.key, exc)
            return _page(503, "Try again", "The acknowledgement could not be recorded; try again in a minute.")
        log.info("gate: %s acknowledged through a signed link sent to %s", link.key, link.to)
        until = f" until {_iso(link.until)}" if link.until else ""
        return _page(
            200,
            "Acknowledged",
            f"Lineage {link.key} is acknowledged{until}: its held submissions are released and the runs so far "
            "no longer hold new ones.",
        )


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


def _confirm(link: AckLink, params: dict[str, str]) -> Response:
    until = f" until {_iso(link.until)}" if link.until else ""
    hidden = "".join(
        f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in sorted(params.items())
    )
    text = (
        f"Acknowledge lineage <b>{html.escape(str(link.key))}</b> (cluster {html.escape(link.key.cluster)}){until}? "
        "Its held submissions are released, and its runs so far no longer hold new ones."
    )
    form = f'<form method="post" action="/gate/ack">{hidden}<button type="submit">Acknowledge</button></form>'
    return _page(200, "Acknowledge", text, raw=form)


def _page(code: int, title: str, text: str, *, raw: str = "") -> Response:
    body = (
        "<!doctype html><html><head><meta charset='utf-8'><title>gpu-auditor: "
        f"{html.escape(title)}</title></head><body><h1>{html.escape(title)}</h1><p>"
        f"{text if raw else html.escape(text)}</p>{raw}</body></html>\n"
    )
    return code, HTML, body.encode()
