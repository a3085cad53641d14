"""Signed acknowledgement links: one lineage, one action, an expiry, one use.

An alert tells the owner that a lineage is (or would be) held; the link in it lets them
acknowledge from Slack without a CLI or cluster credentials. So the link itself is the
credential, and it must say exactly what it may do: HMAC-SHA256 (key from a Secret) over the
action, the lineage key, the acknowledgement's end, the link's expiry, the recipient it was sent
to and a random nonce. Changing any of them breaks the signature; the nonce is the link's id,
which the store records on use (a second use is refused). Pure: the caller passes ``now`` and
the nonce.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Mapping
from urllib.parse import urlencode

from auditor.core.lineage import LineageKey
from auditor.errors import BadInput

#: the actions a link may carry; one per link
LINK_ACTIONS = frozenset({"ack"})
_VERSION = "v1"
#: the query parameters of a link, in the order they are signed
_FIELDS = ("action", "cluster", "namespace", "lineage", "until", "exp", "to", "nonce")


class LinkRefused(BadInput):
    """A link that is forged, altered, expired, for another action, or malformed."""


@dataclass(frozen=True, slots=True)
class AckLink:
    """What a link asks for: ``action`` on ``key`` (ending at ``until``, None: no end), valid
    until ``expires``, sent to ``to`` (recorded as who acknowledged), ``nonce`` its id."""

    action: str
    key: LineageKey
    until: datetime | None
    expires: datetime
    to: str
    nonce: str

    def fields(self) -> dict[str, str]:
        return {
            "action": self.action,
            "cluster": self.key.cluster,
            "namespace": self.key.namespace,
            "lineage": self.key.lineage,
            "until": str(int(self.until.timestamp())) if self.until else "0",
            "exp": str(int(self.expires.timestamp())),
            "to": self.to,
            "nonce": self.nonce,
        }


def _message(fields: Mapping[str, str]) -> bytes:
    # newline-separated: none of the fields may hold one (checked when parsing)
    return "\n".join([_VERSION, *(fields[f] for f in _FIELDS)]).encode()


def sign(link: AckLink, key: bytes) -> str:
    """The link's signature (hex)."""
    if link.action not in LINK_ACTIONS:
        raise ValueError(f"a link cannot carry action {link.action!r}")
    if not key:
        raise ValueError("an empty key signs nothing")
    return hmac.new(key, _message(link.fields()), hashlib.sha256).hexdigest()


def query(link: AckLink, key: bytes) -> str:
    """The link's query string: its fields and signature."""
    return urlencode({**link.fields(), "sig": sign(link, key)})


def url(base: str, link: AckLink, key: bytes) -> str:
    """``<base>/gate/ack?<query>``: what an alert carries."""
    return f"{base.rstrip('/')}/gate/ack?{query(link, key)}"


def verify(params: Mapping[str, str], key: bytes, now: datetime) -> AckLink:
    """The link that ``params`` (a request's query or form) carries, when its signature holds
    and it has not expired; :class:`LinkRefused` (saying why, never which byte) otherwise."""
    if not key:
        raise LinkRefused("acknowledgement links are not enabled here (no key configured)")
    missing = [f for f in (*_FIELDS, "sig") if not params.get(f)]
    if missing:
        raise LinkRefused(f"not an acknowledgement link (missing {', '.join(missing)})")
    fields = {f: str(params[f]) for f in _FIELDS}
    if any("\n" in v or "\r" in v for v in fields.values()):
        raise LinkRefused("not an acknowledgement link (a field holds a line break)")
    expected = hmac.new(key, _message(fields), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, str(params["sig"])):
        raise LinkRefused("the link's signature does not match (altered, or signed with another key)")
    if fields["action"] not in LINK_ACTIONS:
        raise LinkRefused(f"a link cannot {fields['action']!r}")
    try:
        exp = datetime.fromtimestamp(int(fields["exp"]), timezone.utc)
        until_s = int(fields["until"])
    except (ValueError, OverflowError, OSError):
        raise LinkRefused("not an acknowledgement link (bad times)") from None
    if now >= exp:
        raise LinkRefused(f"the link expired at {exp.isoformat().replace('+00:00', 'Z')}")
    return AckLink(
        action=fields["action"],
        key=LineageKey(fields["cluster"], fields["namespace"], fields["lineage"]),
        until=datetime.fromtimestamp(until_s, timezone.utc) if until_s else None,
        expires=exp,
        to=fields["to"],
        nonce=fields["nonce"],
    )


@dataclass(frozen=True, slots=True)
class LinkIssuer:
    """Makes the links that alerts carry: ``base_url`` of the operator, its ``key``, how long a
    link is valid (``ttl``) and how long the acknowledgement it makes lasts (``until``, None: no end)."""

    key: bytes
    base_url: str
    ttl: timedelta
    until: timedelta | None = None

    def issue(self, lineage: LineageKey, to: str, now: datetime, nonce: str) -> str:
        """The link acknowledging ``lineage``, sent to ``to``, issued at ``now`` with id ``nonce``."""
        link = AckLink("ack", lineage, now + self.until if self.until else None, now + self.ttl, to, nonce)
        return url(self.base_url, link, self.key)
