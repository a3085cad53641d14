"""Signed links in alerts: one action on one lineage or job, an expiry, one use.

An alert tells the owner that a lineage is (or would be) held; the link in it lets them
acknowledge from Slack without a CLI or cluster credentials. So the link itself is the
credential, and it must say exactly what it may do: HMAC-SHA256 (key from a Secret) over the
action, the lineage key, the acknowledgement's end, the link's expiry, the recipient it was sent
to and a random nonce. Changing any of them breaks the signature; the nonce is the link's id,
which the store records on use (a second use is refused). Pure: the caller passes ``now`` and
the nonce.

Two actions, two kinds of link (issue 30): ``ack`` acknowledges a *lineage* for the efficiency
gate (its next submissions), ``snooze`` pauses one running *job*'s escalation ladder for a
duration counted from the click. The action is the first signed field and each has its own set
of fields, so a link of one action never verifies as the other: a gate acknowledgement cannot be
replayed as a snooze, nor a snooze as an acknowledgement.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Mapping
from urllib.parse import urlencode

from auditor.core.identity import JobKey, split_job
from auditor.core.lineage import LineageKey
from auditor.errors import BadInput

#: the actions a link may carry; one per link
LINK_ACTIONS = frozenset({"ack", "snooze"})
_VERSION = "v1"
#: the query parameters of a link, in the order they are signed, by action
_FIELDS = ("action", "cluster", "namespace", "lineage", "until", "exp", "to", "nonce")
_SNOOZE_FIELDS = ("action", "cluster", "namespace", "job", "for", "exp", "to", "nonce")
_FIELDS_OF = {"ack": _FIELDS, "snooze": _SNOOZE_FIELDS}
#: a snooze link pauses a ladder for at most this long: a link is a credential anyone holding the
#: alert may use, and a job whose escalation is paused for weeks has in effect been exempted,
#: which is the admin's call (an exemption annotation), not a click's
MAX_SNOOZE = timedelta(days=7)
#: how long a snooze link pauses the ladder unless the settings say otherwise
DEFAULT_SNOOZE = timedelta(hours=24)


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


@dataclass(frozen=True, slots=True)
class SnoozeLink:
    """What a snooze link asks for: pause the escalation ladder of ``job`` for ``duration`` from
    the moment it is used, valid until ``expires``, sent to ``to`` (recorded as who snoozed),
    ``nonce`` its id. The duration, not an end, is signed: a link opened a day after the alert
    still pauses for the time it says."""

    job: JobKey
    duration: timedelta
    expires: datetime
    to: str
    nonce: str
    action: str = "snooze"

    def fields(self) -> dict[str, str]:
        return {
            "action": self.action,
            "cluster": self.job.cluster,
            "namespace": self.job.namespace,
            "job": self.job.job,
            "for": str(int(self.duration.total_seconds())),
            "exp": str(int(self.expires.timestamp())),
            "to": self.to,
            "nonce": self.nonce,
        }


Link = AckLink | SnoozeLink


def _message(fields: Mapping[str, str], names: tuple[str, ...]) -> bytes:
    # newline-separated: none of the fields may hold one (checked when parsing); the action comes
    # first, so the two actions' messages never coincide
    return "\n".join([_VERSION, *(fields[f] for f in names)]).encode()


def sign(link: Link, key: bytes) -> str:
    """The link's signature (hex)."""
    if link.action not in LINK_ACTIONS or (link.action == "snooze") != isinstance(link, SnoozeLink):
        raise ValueError(f"a link cannot carry action {link.action!r}")
    if isinstance(link, SnoozeLink) and not timedelta(0) < link.duration <= MAX_SNOOZE:
        raise ValueError(f"a snooze link pauses for more than 0 and at most {MAX_SNOOZE}")
    if not key:
        raise ValueError("an empty key signs nothing")
    return hmac.new(key, _message(link.fields(), _FIELDS_OF[link.action]), hashlib.sha256).hexdigest()


def query(link: Link, key: bytes) -> str:
    """The link's query string: its fields and signature."""
    return urlencode({**link.fields(), "sig": sign(link, key)})


def url(base: str, link: Link, key: bytes) -> str:
    """``<base>/gate/ack?<query>``: what an alert carries (both actions are served there)."""
    return f"{base.rstrip('/')}/gate/ack?{query(link, key)}"


def verify(params: Mapping[str, str], key: bytes, now: datetime) -> Link:
    """The link that ``params`` (a request's query or form) carries, when its signature holds
    and it has not expired; :class:`LinkRefused` (saying why, never which byte) otherwise."""
    if not key:
        raise LinkRefused("acknowledgement links are not enabled here (no key configured)")
    names = _FIELDS_OF.get(str(params.get("action") or ""), _FIELDS)
    missing = [f for f in (*names, "sig") if not params.get(f)]
    if missing:
        raise LinkRefused(f"not an acknowledgement link (missing {', '.join(missing)})")
    fields = {f: str(params[f]) for f in names}
    if any("\n" in v or "\r" in v for v in fields.values()):
        raise LinkRefused("not an acknowledgement link (a field holds a line break)")
    expected = hmac.new(key, _message(fields, names), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, str(params["sig"])):
        raise LinkRefused("the link's signature does not match (altered, or signed with another key)")
    if fields["action"] not in LINK_ACTIONS:
        raise LinkRefused(f"a link cannot {fields['action']!r}")
    try:
        exp = datetime.fromtimestamp(int(fields["exp"]), timezone.utc)
        until_s = int(fields["until" if fields["action"] == "ack" else "for"])
    except (ValueError, OverflowError, OSError):
        raise LinkRefused("not an acknowledgement link (bad times)") from None
    if now >= exp:
        raise LinkRefused(f"the link expired at {exp.isoformat().replace('+00:00', 'Z')}")
    if fields["action"] == "snooze":
        return _snooze(fields, timedelta(seconds=until_s), exp)
    return AckLink(
        action=fields["action"],
        key=LineageKey(fields["cluster"], fields["namespace"], fields["lineage"]),
        until=datetime.fromtimestamp(until_s, timezone.utc) if until_s else None,
        expires=exp,
        to=fields["to"],
        nonce=fields["nonce"],
    )


def _snooze(fields: Mapping[str, str], duration: timedelta, exp: datetime) -> SnoozeLink:
    if not timedelta(0) < duration <= MAX_SNOOZE:
        raise LinkRefused(f"a snooze link pauses for more than 0 and at most {MAX_SNOOZE}")
    try:
        kind, name = split_job(fields["job"])
    except ValueError:
        raise LinkRefused("not a snooze link (job is not Kind/name)") from None
    job = JobKey(fields["cluster"], fields["namespace"], kind, name)
    return SnoozeLink(job, duration, exp, fields["to"], fields["nonce"])


def hours_text(duration: timedelta) -> str:
    """``24 h``, ``1.5 h``: a snooze's length as the alert's button and the confirmation say it."""
    return f"{duration.total_seconds() / 3600:g} h"


#: the words of the two buttons, the same on every surface (Slack, webhook, e-mail-less pages,
#: the console): what each does, so that an owner who wants the running job left alone does not
#: acknowledge the lineage instead
ACK_LABEL = "Acknowledge for re-submission (gate)"


def snooze_label(duration: timedelta) -> str:
    """``Snooze this job's escalation for 24 h``."""
    return f"Snooze this job's escalation for {hours_text(duration)}"


@dataclass(frozen=True, slots=True)
class LinkIssuer:
    """Makes the links that alerts carry: ``base_url`` of the operator, its ``key``, how long a
    link is valid (``ttl``), how long the acknowledgement it makes lasts (``until``, None: no end)
    and how long a snooze link pauses a job's ladder (``snooze``, at most :data:`MAX_SNOOZE`)."""

    key: bytes
    base_url: str
    ttl: timedelta
    until: timedelta | None = None
    snooze: timedelta = DEFAULT_SNOOZE

    def issue(self, lineage: LineageKey, to: str, now: datetime, nonce: str) -> str:
        """The link acknowledging ``lineage``, sent to ``to``, issued at ``now`` with id ``nonce``."""
        link = AckLink("ack", lineage, now + self.until if self.until else None, now + self.ttl, to, nonce)
        return url(self.base_url, link, self.key)

    def issue_snooze(self, job: JobKey, to: str, now: datetime, nonce: str) -> str:
        """The link pausing ``job``'s escalation for :attr:`snooze`, sent to ``to``, issued at
        ``now`` with id ``nonce`` (a link distinct from the acknowledgement's, with its own nonce)."""
        return url(self.base_url, SnoozeLink(job, self.snooze, now + self.ttl, to, nonce), self.key)
