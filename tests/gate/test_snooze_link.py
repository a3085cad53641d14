"""The alert's snooze link (issue 30): signed like the gate's acknowledgement link but a distinct
action (neither verifies as the other), bounded, single-use, recorded in the store's job snoozes
on SQLite and PostgreSQL, redeemed on ``/gate/ack`` (GET confirms, POST snoozes from the click)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest
from revisions import assert_tables_match_migrations

from auditor.core.acklink import (
    ACK_LABEL,
    MAX_SNOOZE,
    AckLink,
    LinkIssuer,
    LinkRefused,
    SnoozeLink,
    query,
    sign,
    snooze_label,
    verify,
)
from auditor.core.identity import JobKey
from auditor.core.job_snooze import JobSnooze, in_force
from auditor.core.lineage import LineageKey
from auditor.errors import BadInput
from auditor.operator_loop.ack_endpoint import AckEndpoint
from auditor.store.job_snoozes import TABLES, JobSnoozeLog
from auditor.store.lineage import AckLog, LinkAlreadyUsed
from auditor.store.store import Store

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
KEY = b"0123456789abcdef-secret"
JOB = JobKey("c1", "ml", "PyTorchJob", "train-7f9c2")
LINK = SnoozeLink(JOB, timedelta(hours=24), NOW + timedelta(days=7), "team:vision", "sn00ze")
ACK = AckLink("ack", LineageKey("c1", "ml", "train"), None, NOW + timedelta(days=7), "team:vision", "n0nce")


def params(link: SnoozeLink | AckLink = LINK) -> dict[str, str]:
    return dict(parse_qsl(query(link, KEY)))


def test_a_snooze_link_round_trips_and_says_its_words() -> None:
    assert verify(params(), KEY, NOW) == LINK
    assert params()["for"] == "86400" and params()["job"] == "PyTorchJob/train-7f9c2"
    issued = LinkIssuer(KEY, "https://a.example.com/", timedelta(days=7), snooze=timedelta(hours=2)).issue_snooze(
        JOB, "team:vision", NOW, "n1"
    )
    assert urlsplit(issued).path == "/gate/ack"
    assert verify(dict(parse_qsl(urlsplit(issued).query)), KEY, NOW).duration == timedelta(hours=2)  # type: ignore[union-attr]
    assert snooze_label(timedelta(hours=24)) == "Snooze this job's escalation for 24 h"
    assert snooze_label(timedelta(minutes=90)) == "Snooze this job's escalation for 1.5 h"
    assert ACK_LABEL == "Acknowledge for re-submission (gate)"


@pytest.mark.parametrize(
    ("field", "value"),
    [("job", "PyTorchJob/other"), ("namespace", "prod"), ("cluster", "c2"), ("for", "604800"), ("to", "x")]
    + [("nonce", "n1"), ("exp", str(int((NOW + timedelta(days=70)).timestamp()))), ("sig", "0" * 64)],
)
def test_changing_any_field_of_a_snooze_link_breaks_its_signature(field: str, value: str) -> None:
    with pytest.raises(LinkRefused, match="signature does not match"):
        verify(params() | {field: value}, KEY, NOW)


def test_neither_action_is_replayed_as_the_other() -> None:
    """The action is signed and picks the signed fields: an acknowledgement link relabelled as a
    snooze (and the reverse), even with the other action's fields added, is refused."""
    for p in (params(ACK) | {"action": "snooze", "job": "Job/x", "for": "3600"}, params() | {"action": "ack"}):
        with pytest.raises(LinkRefused):
            verify(p, KEY, NOW)
    # the other's fields filled from the link itself: still the wrong signature
    as_ack = params() | {"action": "ack", "lineage": "train", "until": "0"}
    with pytest.raises(LinkRefused, match="signature does not match"):
        verify(as_ack, KEY, NOW)


def test_a_snooze_is_bounded_and_expires() -> None:
    with pytest.raises(ValueError, match="at most"):
        sign(SnoozeLink(JOB, MAX_SNOOZE + timedelta(seconds=1), LINK.expires, "x", "n"), KEY)
    with pytest.raises(ValueError):
        sign(SnoozeLink(JOB, timedelta(0), LINK.expires, "x", "n"), KEY)
    with pytest.raises(ValueError):
        sign(AckLink("snooze", ACK.key, None, ACK.expires, "x", "n"), KEY)  # a snooze is a SnoozeLink
    with pytest.raises(LinkRefused, match="expired at 2026-12-07T12:00:00Z"):
        verify(params(), KEY, NOW + timedelta(days=7))


def test_in_force_keeps_the_longest_current_snooze_per_job() -> None:
    a = JobSnooze(JOB, "u1", NOW, NOW + timedelta(hours=24))
    b = JobSnooze(JOB, "u2", NOW + timedelta(hours=1), NOW + timedelta(hours=2))
    old = JobSnooze(JobKey("c1", "ml", "Job", "old"), "u3", NOW - timedelta(days=2), NOW - timedelta(days=1))
    assert in_force([a, b, old], NOW + timedelta(hours=1)) == {JOB: a}
    assert in_force([a, b, old], NOW + timedelta(hours=24)) == {}
    assert a.text() == "snoozed until 2026-12-01T12:00:00Z by u1"


@pytest.fixture
def store(store_url: str):
    s = Store.open(store_url)
    yield s
    s.close()


def test_job_snoozes_table_matches_its_migration(store_url: str) -> None:
    Store.open(store_url).close()
    assert_tables_match_migrations(store_url, TABLES)


def test_the_store_records_snoozes_once_per_link(store: Store) -> None:
    log = JobSnoozeLog(store)
    s = log.snooze(JOB, "link:team:vision", NOW + timedelta(hours=24), "r", NOW, via="link", link_id="n1")
    with pytest.raises(LinkAlreadyUsed):
        log.snooze(JOB, "link:team:vision", NOW + timedelta(hours=25), "r", NOW, via="link", link_id="n1")
    with pytest.raises(BadInput, match="not after now"):
        log.snooze(JOB, "me", NOW, "", NOW)
    other = JobKey("c2", "ml", "PyTorchJob", "train-7f9c2")
    log.snooze(other, "me", NOW + timedelta(hours=1), "", NOW)
    assert log.link_used("n1") and not log.link_used("n2")
    assert log.of_job(JOB) == [s]
    assert log.in_force(NOW + timedelta(minutes=1)) == {JOB: s, other: log.of_job(other)[0]}
    assert log.in_force(NOW + timedelta(minutes=1), cluster="c1") == {JOB: s}
    assert log.in_force(NOW + timedelta(hours=24)) == {}
    assert store.job_snoozes().in_force(NOW) == {JOB: s, other: log.of_job(other)[0]}


def test_the_endpoint_confirms_on_get_and_snoozes_once_on_post(store: Store) -> None:
    clock = {"now": NOW + timedelta(hours=30)}  # clicked a day and more after the alert
    log = JobSnoozeLog(store)
    ep = AckEndpoint(AckLog(store), KEY, cluster="c1", clock=lambda: clock["now"], snoozes=log)
    code, _, body = ep.handle("GET", urlencode(params()), b"")
    page = body.decode()
    assert code == 200 and "Snooze this job&#x27;s escalation for 24 h" in page and 'method="post"' in page
    assert "not acknowledged for the gate" in page and log.of_job(JOB) == []  # a GET records nothing
    code, _, body = ep.handle("POST", "", urlencode(params()).encode())
    assert code == 200 and "paused until 2026-12-02T18:00:00Z" in body.decode()
    [s] = log.of_job(JOB)
    assert (s.by, s.via, s.at, s.until) == (
        "link:team:vision",
        "link",
        clock["now"],
        clock["now"] + timedelta(hours=24),
    )
    assert ep.handle("POST", "", urlencode(params()).encode())[0] == 409
    assert ep.handle("GET", urlencode(params()), b"")[0] == 409
    # the snooze acknowledged nothing for the gate, and an acknowledgement link still works beside it
    assert AckLog(store).acks(ACK.key) == []
    assert ep.handle("POST", "", urlencode(params(ACK)).encode())[0] == 200
    assert log.of_job(JOB) == [s] and len(AckLog(store).acks(ACK.key)) == 1


def test_the_endpoint_refuses_other_clusters_and_works_without_a_snooze_store(store: Store) -> None:
    other = SnoozeLink(JobKey("c2", "ml", "Job", "a"), timedelta(hours=1), LINK.expires, "x", "n9")
    ep = AckEndpoint(AckLog(store), KEY, cluster="c1", clock=lambda: NOW, snoozes=JobSnoozeLog(store))
    code, _, body = ep.handle("POST", "", urlencode(params(other)).encode())
    assert code == 403 and "cluster c2" in body.decode()
    bare = AckEndpoint(AckLog(store), KEY, cluster="c1", clock=lambda: NOW)
    assert bare.handle("POST", "", urlencode(params()).encode())[0] == 503
