"""``/gate/ack`` on the operator's HTTP server: a real server, a real store (SQLite, PostgreSQL)."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qsl, urlencode

import pytest

from auditor.core.acklink import AckLink, url
from auditor.core.gate import GateAction, GateMode, GateRule, LineageRun, decide
from auditor.core.lineage import LineageKey
from auditor.operator_loop.ack_endpoint import PATH, AckEndpoint, read_link_key
from auditor.operator_loop.health import HealthServer, OperatorMetrics
from auditor.store.lineage import AckLog, LineageHistoryReader, LineageRecorder
from auditor.store.store import Store

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
SECRET = b"a-key-of-sixteen-bytes-or-more"
KEY = LineageKey("c1", "ml", "train")
RULE = GateRule("hold", GateAction.HOLD, verdicts=frozenset({"low_sm_efficiency"}), at_least=2)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.testbed)])
def store(request: pytest.FixtureRequest, tmp_path):
    u = f"sqlite:///{tmp_path}/s.db" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    s = Store.open(u)
    yield s
    s.close()


@pytest.fixture
def server(store: Store):
    clock = {"now": NOW}
    endpoint = AckEndpoint(AckLog(store), SECRET, cluster="c1", clock=lambda: clock["now"])
    srv = HealthServer(
        "127.0.0.1",
        0,
        metrics=OperatorMetrics(),
        healthy=lambda: (True, "ok"),
        ready=lambda: (True, "ok"),
        routes={PATH: endpoint.handle},
    ).start()
    yield f"http://127.0.0.1:{srv.port}", clock
    srv.stop()


def fetch(u: str, form: dict[str, str] | None = None) -> tuple[int, str]:
    data = urlencode(form).encode() if form is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(u, data=data), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def link(nonce: str = "n-1", **kw: object) -> AckLink:
    fields: dict = {
        "action": "ack",
        "key": KEY,
        "until": NOW + timedelta(days=30),
        "expires": NOW + timedelta(days=7),
        "to": "team:vision",
        "nonce": nonce,
    }
    return AckLink(**(fields | kw))


def test_get_confirms_post_acknowledges_once_and_the_gate_admits(store: Store, server) -> None:
    base, clock = server
    rec = LineageRecorder(store)
    for i in range(2):
        rec.record(KEY, LineageRun(f"Job/train-{i}", "low_sm_efficiency", start=NOW - timedelta(days=2 - i)), NOW)
    reader = LineageHistoryReader(store)
    assert decide(reader.history(KEY, NOW), [RULE], GateMode.ENFORCE, NOW).action is GateAction.HOLD

    u = url(base, link(), SECRET)
    # a preview bot's GET changes nothing: it shows what the link would do
    for _ in range(2):
        code, page = fetch(u)
        assert code == 200 and "Acknowledge lineage <b>ml/train</b> (cluster c1) until 2026-12-30T12:00:00Z" in page
    assert AckLog(store).acks(KEY) == []
    form = dict(parse_qsl(u.split("?", 1)[1]))
    clock["now"] = NOW + timedelta(hours=1)
    code, page = fetch(f"{base}{PATH}", form)
    assert code == 200 and "ml/train is acknowledged until 2026-12-30T12:00:00Z" in page
    [ack] = AckLog(store).acks(KEY)
    assert (ack.by, ack.via, ack.at, ack.until) == (
        "link:team:vision",
        "link",
        NOW + timedelta(hours=1),
        NOW + timedelta(days=30),
    )
    later = NOW + timedelta(hours=2)
    d = decide(reader.history(KEY, later), [RULE], GateMode.ENFORCE, later)
    assert d.action is GateAction.ADMIT and d.acknowledged_by == "link:team:vision"
    # single use: a second POST, or a GET, says so and records nothing
    assert fetch(f"{base}{PATH}", form)[0] == 409
    code, page = fetch(u)
    assert code == 409 and "a link acknowledges once" in page
    assert len(AckLog(store).acks(KEY)) == 1


def test_forged_expired_and_foreign_links_are_refused(store: Store, server) -> None:
    base, clock = server
    forged = url(base, link(), b"not-the-operators-key-at-all").split("?", 1)[1]
    code, page = fetch(f"{base}{PATH}", dict(parse_qsl(forged)))
    assert code == 403 and "signature does not match" in page
    tampered = dict(parse_qsl(url(base, link(), SECRET).split("?", 1)[1])) | {"lineage": "prod-train"}
    assert fetch(f"{base}{PATH}", tampered)[0] == 403
    clock["now"] = NOW + timedelta(days=8)
    code, page = fetch(url(base, link("n-2"), SECRET))
    assert code == 403 and "expired" in page
    clock["now"] = NOW
    other = link("n-3", key=LineageKey("c2", "ml", "train"))
    code, page = fetch(f"{base}{PATH}", dict(parse_qsl(url(base, other, SECRET).split("?", 1)[1])))
    assert code == 403 and "for cluster c2" in page
    assert fetch(f"{base}{PATH}?action=ack")[0] == 403
    assert AckLog(store).acks(KEY) == [] and AckLog(store).acks(other.key) == []
    # the server's other endpoints are as before
    assert fetch(f"{base}/healthz")[0] == 200 and fetch(f"{base}/nope", {"a": "b"})[0] == 404


def test_the_key_file_must_hold_a_real_key(tmp_path) -> None:
    from auditor.errors import BadInput

    f = tmp_path / "key"
    f.write_bytes(SECRET + b"\n")
    assert read_link_key(str(f)) == SECRET
    f.write_bytes(b"short\n")
    with pytest.raises(BadInput, match="at least 16 bytes"):
        read_link_key(str(f))
    with pytest.raises(BadInput, match="cannot read"):
        read_link_key(str(tmp_path / "missing"))
