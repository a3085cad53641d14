"""Signed acknowledgement links: what the signature covers, expiry, refusal reasons."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qsl, urlsplit

import pytest

from auditor.core.acklink import AckLink, LinkRefused, query, sign, url, verify
from auditor.core.lineage import LineageKey

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
KEY = b"0123456789abcdef-secret"
LINK = AckLink(
    action="ack",
    key=LineageKey("c1", "ml", "train"),
    until=NOW + timedelta(days=30),
    expires=NOW + timedelta(days=7),
    to="team:vision",
    nonce="n0nce",
)


def params() -> dict[str, str]:
    return dict(parse_qsl(query(LINK, KEY)))


def test_a_link_round_trips() -> None:
    assert verify(params(), KEY, NOW) == LINK
    u = url("https://auditor.example.com/", LINK, KEY)
    assert urlsplit(u).path == "/gate/ack" and u.startswith("https://auditor.example.com/gate/ack?action=ack&")
    no_end = AckLink("ack", LINK.key, None, LINK.expires, "x", "n2")
    assert verify(dict(parse_qsl(query(no_end, KEY))), KEY, NOW).until is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lineage", "other"),
        ("namespace", "prod"),
        ("cluster", "c2"),
        ("until", "0"),
        ("exp", str(int((NOW + timedelta(days=70)).timestamp()))),
        ("to", "team:other"),
        ("nonce", "n1"),
        ("sig", "0" * 64),
    ],
)
def test_changing_any_field_breaks_the_signature(field: str, value: str) -> None:
    p = params() | {field: value}
    with pytest.raises(LinkRefused, match="signature does not match"):
        verify(p, KEY, NOW)


def test_an_acknowledgement_relabelled_as_a_snooze_is_refused() -> None:
    """A snooze link has other signed fields (tests/gate/test_snooze_link.py): relabelled, an
    acknowledgement link lacks them, and with them added its signature does not match."""
    with pytest.raises(LinkRefused, match="missing job, for"):
        verify(params() | {"action": "snooze"}, KEY, NOW)
    with pytest.raises(LinkRefused, match="signature does not match"):
        verify(params() | {"action": "snooze", "job": "Job/train", "for": "3600"}, KEY, NOW)


def test_another_key_expired_missing_or_no_key_is_refused() -> None:
    with pytest.raises(LinkRefused, match="signature"):
        verify(params(), b"another key of 16+ bytes", NOW)
    with pytest.raises(LinkRefused, match="expired at 2026-12-07T12:00:00Z"):
        verify(params(), KEY, NOW + timedelta(days=7))
    assert verify(params(), KEY, NOW + timedelta(days=7) - timedelta(seconds=1)) == LINK
    p = params()
    del p["nonce"]
    with pytest.raises(LinkRefused, match="missing nonce"):
        verify(p, KEY, NOW)
    with pytest.raises(LinkRefused, match="not enabled"):
        verify(params(), b"", NOW)
    with pytest.raises(LinkRefused, match="line break"):
        verify(params() | {"to": "a\nb"}, KEY, NOW)


def test_only_single_purpose_actions_are_signed() -> None:
    with pytest.raises(ValueError):
        sign(AckLink("delete", LINK.key, None, LINK.expires, "x", "n"), KEY)
    with pytest.raises(ValueError):
        sign(LINK, b"")
