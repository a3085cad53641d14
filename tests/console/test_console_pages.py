"""The console's pages over HTTP, from the operator's own server: every page shows the store's
facts, the job list filters, sorts and pages on the server, hostile labels stay text, and
acknowledging is refused unless writes are on and the form's token is the user's."""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from datetime import timedelta

import pytest

from auditor.cli.main import build_parser, main
from auditor.console.app import ConsoleApp, ConsoleConfig
from auditor.core.lineage import LineageKey
from auditor.store.console_queries import ConsoleQueries
from auditor.store.lineage import AckLog
from tests.console.conftest import Console
from tests.console.data import CLUSTER, HELD_LINEAGE, HOSTILE_TEAM, NOW


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def post(url: str, form: dict[str, str], headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    data = urllib.parse.urlencode(form).encode()
    req = urllib.request.Request(url, data=data, headers=headers or {}, method="POST")
    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=30) as r:
            return r.status, r.headers.get("Location", ""), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location", ""), exc.read().decode()


def rows(page: str) -> list[str]:
    body = page.split('<table class="jobs">', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr><td>(.*?)</tr>", body.split("<tbody>", 1)[1])


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/", ["GPU-hours by verdict", "low_sm_efficiency", "Waste GPU-hours by team, week 2026-W48", "running jobs"]),
        ("/teams", ["2026-W48", "llm", "research", "efficiency"]),
        ("/jobs", ["llm/PyTorchJob/llm-finetune", "of 18 jobs"]),  # issue 28: + gpt-pretrain and its fused twin
        (
            "/policy",
            [
                "high-util-low-sm",
                "step 2: notify",
                "next cycle (due since 2026-11-25 09:00)",
                "slack: 503 Service Unavailable",
                "Open violations (1)",
            ],
        ),
        (
            "/gate",
            [
                f"llm/{HELD_LINEAGE}",
                "hold-repeated-low-sm",
                "would hold",
                "kube:bob",
                "input pipeline fix",
                "gate is off",
            ],
        ),
        ("/deliveries", ["2026-W48", "webhook: timed out", "failed", "sent", "slack: 503"]),
    ],
)
def test_every_page_shows_the_stores_facts(console: Console, path: str, expected: list[str]) -> None:
    status, page = get(console.url + path)
    assert status == 200
    for text in expected:
        assert text in page, f"{path}: {text!r} missing"


def test_job_list_filters_sorts_and_pages_on_the_server(console: Console) -> None:
    _, page = get(console.url + "/jobs?team=llm")
    got = rows(page)
    # llm: finetune, kernel-debug, serve, naive-attn, and (issue 28) gpt-pretrain and its fused twin
    assert len(got) == 6 and all("<td>llm</td>" in r for r in got)

    _, page = get(console.url + "/jobs?sort=gpu_hours&desc=0&limit=3")
    hours = [float(re.findall(r"<td>([\d.,]+)</td>", r)[0]) for r in rows(page)]
    assert hours == sorted(hours) and len(hours) == 3
    assert "1–3 of 18 jobs" in page and 'rel="next"' in page

    _, page = get(console.url + "/jobs?verdict=healthy&q=serve")
    assert [re.search(r">([^<]+)</a>", r).group(1) for r in rows(page)] == ["llm/Deployment/llm-serve"]  # type: ignore[union-attr]

    status, page = get(console.url + "/jobs?sort=name;drop")
    assert status == 400 and "sort: &#x27;name;drop&#x27; is not one of" in page


def test_job_page_shows_findings_timelines_lineage_kueue_and_actions(console: Console) -> None:
    status, page = get(f"{console.url}/jobs/{console.ids['finetune']}")
    assert status == 200
    assert "collective_wait_straggler" in page and "<summary>evidence</summary>" in page
    assert page.count('<svg class="chart timeline"') == 4  # one per GPU of the 4-GPU job
    assert all(f'data-metric="{m}"' in page for m in ("gpu_util", "sm_active", "tensor_active", "dram_active"))
    assert "pytorchjob-llm-finetune-3f2a1" in page and "480 s" in page and "gpu-cluster-queue" in page
    assert "SM active 4 % while busy 78 % for 3 h" in page and "slack: 503 Service Unavailable" in page
    assert "lineage <b>llm/llm-finetune</b>" in page
    assert 'id="ack-button"' in page  # writes are on in this server


def test_hostile_labels_are_text_everywhere(console: Console) -> None:
    for path in (
        "/jobs",
        "/",
        "/teams",
        f"/jobs/{console.ids['hostile']}",
        "/jobs?team=" + urllib.parse.quote(HOSTILE_TEAM),
    ):
        _, page = get(console.url + path)
        assert "<script>window.pwned" not in page and "<img src=x" not in page, path
    _, page = get(console.url + "/jobs?team=" + urllib.parse.quote(HOSTILE_TEAM))
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page and "1–1 of 1 jobs" in page


def test_read_only_console_refuses_writes(console: Console) -> None:
    app = ConsoleApp(ConsoleQueries(console.store), lambda: NOW, ConsoleConfig(writes=False))
    r = app.handle("GET", f"/jobs/{console.ids['finetune']}", "", {}, b"")
    assert r.status == 200 and b"ack-button" not in r.body and b"read-only" in r.body
    form = f"csrf={app.token('console')}&lineage=llm/llm-finetune&cluster={CLUSTER}&kind=ack"
    assert app.handle("POST", "/ack", "", {}, form.encode()).status == 403
    assert AckLog(console.store).acks(LineageKey(CLUSTER, "llm", "llm-finetune")) == []


def test_ack_needs_the_users_own_token(console: Console) -> None:
    form = {"lineage": "research/spin-test", "cluster": CLUSTER, "kind": "ack", "until": "7d"}
    status, _, page = post(console.url + "/ack", {**form, "csrf": "0" * 64}, {"X-Forwarded-User": "mallory"})
    assert status == 403 and "form token" in page
    # alice's token does not work for mallory
    status, _, _ = post(
        console.url + "/ack", {**form, "csrf": console.app.token("alice")}, {"X-Forwarded-User": "mallory"}
    )
    assert status == 403
    assert AckLog(console.store).acks(LineageKey(CLUSTER, "research", "spin-test")) == []


def test_snooze_is_recorded_with_who_and_until(console: Console) -> None:
    token = console.app.token("carol@example.com")
    form = {"csrf": token, "lineage": "recsys/feature-prep", "cluster": CLUSTER, "kind": "snooze", "until": "1d"}
    form |= {"reason": "rerun after the data fix", "job": "7"}
    status, location, _ = post(console.url + "/ack", form, {"X-Forwarded-Email": "carol@example.com"})
    assert status == 303 and location.endswith("/console/jobs/7")
    (ack,) = AckLog(console.store).acks(LineageKey(CLUSTER, "recsys", "feature-prep"))
    assert (ack.by, ack.kind.value, ack.via, ack.at, ack.until) == (
        "carol@example.com",
        "snooze",
        "console",
        NOW,
        NOW + timedelta(days=1),
    )
    assert ack.reason == "rerun after the data fix"


def test_console_command_serves_a_store(console: Console, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(console.store._db._url.render_as_string(hide_password=False))
    args = build_parser().parse_args(["console", "--db", url, "--listen", "127.0.0.1:0"])
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=args.handler, args=(args,), kwargs={"ready": ready, "stop": stop}, daemon=True)
    thread.start()
    try:
        assert ready.wait(30)
        status, page = get(f"http://127.0.0.1:{args.port}/console/jobs?team=vision")
        assert status == 200 and "vision/PyTorchJob/resnet50-train" in page and "read-only" in page
        status, index = get(f"http://127.0.0.1:{args.port}/")
        assert status == 200 and "url=/console/" in index
    finally:
        stop.set()
        thread.join(10)
    assert "console (read-only) on http://127.0.0.1:" in capsys.readouterr().err


def test_console_command_refuses_a_bad_listen_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["console", "--db", "sqlite:///nowhere.db", "--listen", "localhost"]) == 2
    assert "--listen 'localhost': expected HOST:PORT" in capsys.readouterr().err


def test_next_step_is_due_after_its_wait_and_cooldown() -> None:
    from auditor.console.pages import Step, next_step
    from auditor.console.ports import ViolationRow

    ladder = [
        Step(("annotate",), timedelta(0), timedelta(0)),
        Step(("requeue",), timedelta(hours=2), timedelta(hours=1)),
    ]
    v = ViolationRow(1, "c", "ns/Job/a", None, "p", 1, NOW - timedelta(minutes=90), NOW, 1, NOW - timedelta(minutes=10))
    assert next_step(v, ladder, NOW) == ("step 2: requeue", "2026-11-25 12:50")  # last step + 1 h cooldown
    fresh = ViolationRow(1, "c", "ns/Job/a", None, "p", 1, NOW - timedelta(minutes=90), NOW, 1, None)
    assert next_step(fresh, ladder, NOW)[1] == "2026-11-25 12:30"  # opened + 2 h
    done = ViolationRow(1, "c", "ns/Job/a", None, "p", 1, NOW, NOW, 2, NOW)
    assert next_step(done, ladder, NOW) == ("ladder done", "")
    assert next_step(v, None, NOW) == ("policy not loaded here", "")


def test_teams_show_cost_only_when_priced(console: Console) -> None:
    priced = ConsoleApp(
        ConsoleQueries(console.store), lambda: NOW, ConsoleConfig(prices={"NVIDIA H200": 3.5}, currency="EUR")
    )
    page = priced.handle("GET", "/teams", "", {}, b"").body.decode()
    assert "<th>EUR</th>" in page
    llm = re.search(r">llm</a></td><td>2026-W48</td><td>\d+</td><td>([\d.,]+)</td>.*?<td>([\d.,]+)</td></tr>", page)
    assert llm is not None and float(llm.group(2).replace(",", "")) == pytest.approx(
        3.5 * float(llm.group(1).replace(",", "")),
        abs=0.2,  # hours shown to 0.1
    )
    _, unpriced = get(console.url + "/teams")
    assert "<th>USD</th>" not in unpriced and "<th>EUR</th>" not in unpriced
