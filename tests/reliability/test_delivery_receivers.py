"""Slow, hung and failing receivers (issue 20, "slow receivers"): each message arrives once, a
delivery ends within its deadline, and a webhook's retries carry one idempotency key.

Real local receivers behind the fault proxy; timeouts and deadlines are set short through the
retry policy, so each test takes about a second.
"""

from __future__ import annotations

import time

from faultproxy import Fault

from auditor.notify import SlackNotifier, WebhookNotifier
from auditor.notify.http import RetryPolicy

SHORT = RetryPolicy(attempts=4, base=0.01, cap=0.05, max_wait=1, timeout=0.3, deadline=3.0)


def test_a_slack_receiver_answering_after_the_timeout_gets_the_message_once(fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).always(Fault.slow(0.8))
    d = SlackNotifier(proxy.url, retry=SHORT, sleep=lambda s: None).send("job x wastes its GPUs")
    time.sleep(0.9)  # the late answers come in
    assert len(receiver.requests) == 1, "Slack cannot drop duplicates: a message without an answer is not resent"
    assert not d.ok and d.unconfirmed and d.attempts == 1
    assert "may have arrived; not resent" in (d.error or "")


def test_slack_retries_what_surely_did_not_arrive(fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).script(Fault.status_code(503), Fault.status_code(429, retry_after="0"))
    d = SlackNotifier(proxy.url, retry=SHORT, sleep=lambda s: None).send("m")
    assert d.ok and d.attempts == 3
    assert len(receiver.accepted) == 1


def test_webhook_retries_a_lost_answer_under_one_idempotency_key(fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).script(Fault.slow(0.8), Fault.truncate())
    d = WebhookNotifier(proxy.url, "k", retry=SHORT, sleep=lambda s: None).send("policy.violation", {"a": 1})
    assert d.ok and d.attempts == 3
    ids = {(r.headers["X-Gpu-Auditor-Delivery"], r.headers["Idempotency-Key"]) for r in receiver.requests}
    assert ids == {(d.delivery_id, d.delivery_id)}, "every copy carries the same key: the receiver keeps one"


def test_a_hung_receiver_costs_at_most_the_deadline(fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).always(Fault.hang(5))
    policy = RetryPolicy(attempts=20, base=0.01, cap=0.05, max_wait=1, timeout=0.4, deadline=1.0)
    t0 = time.monotonic()
    d = WebhookNotifier(proxy.url, "k", retry=policy).send("policy.violation", {"a": 1})
    took = time.monotonic() - t0
    assert not d.ok and took < 1.5, f"{took:.2f} s for a deadline of 1 s"
    assert "deadline of 1 s" in (d.error or "") or d.attempts < 20
    assert receiver.requests == []


def test_an_html_error_page_is_a_failure_with_one_clear_line(fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).always(Fault.html(502))
    d = WebhookNotifier(proxy.url, "k", retry=SHORT, sleep=lambda s: None).send("policy.violation", {})
    assert not d.ok and d.status == 502 and d.error is not None and "\n" not in d.error
    assert d.error.startswith("HTTP 502")
