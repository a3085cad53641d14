"""One careful HTTP POST with retries, shared by the notifiers.

Retry policy (the same for Slack and the generic webhook, and documented in docs/policies.md):
- a network error, a timeout, any 5xx and 429 are retried, with exponential backoff and jitter;
- ``Retry-After`` (seconds or an HTTP date) on a 429 or 503 is honoured, capped by ``max_wait``;
- any other 4xx is final at once: the request itself is wrong and repeating it cannot help;
- 2xx is success. At most ``attempts`` tries in all, and never past ``deadline`` seconds from
  the first (each try's timeout is cut to what is left), so a hung receiver costs a bounded time;
- a request that was sent but got no answer (a read timeout, a connection dropped mid-answer)
  may have arrived: it is resent only where the receiver can drop duplicates
  (``retry_unanswered``: the webhook, whose delivery id stays the same across retries); Slack
  incoming webhooks take no idempotency key, so there it is reported *unconfirmed*, not resent.
"""

from __future__ import annotations

import dataclasses
import email.utils
import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Mapping

import requests
import urllib3

from auditor.clock import SYSTEM_CLOCK
from auditor.redact import mask_text, register_url


@dataclass(frozen=True)
class Delivery:
    """The outcome of one notification: delivered or not, after how many attempts, and why."""

    ok: bool
    status: int | None
    attempts: int
    delivery_id: str = ""
    error: str | None = None
    response_body: str = field(default="", repr=False)
    #: sent, but no answer came: it may have arrived (and is not resent where duplicates show)
    unconfirmed: bool = False
    #: a later try could succeed (network error, timeout, 5xx, 429); False for other 4xx
    retryable: bool = False
    #: the receiver's Retry-After, in seconds, when it gave one
    retry_after: float | None = None

    def as_dict(self) -> dict:
        """A JSON-ready record (stored as an action's result)."""
        return {
            "ok": self.ok,
            "status": self.status,
            "attempts": self.attempts,
            "delivery_id": self.delivery_id,
            "error": self.error,
            "unconfirmed": self.unconfirmed,
        }


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: attempts in all, backoff base and cap, longest Retry-After honoured."""

    attempts: int = 4
    base: float = 0.5
    cap: float = 10.0
    max_wait: float = 60.0
    timeout: float = 10.0
    #: all tries and waits of one delivery end within this many seconds
    deadline: float = 30.0
    #: resend a request that got no answer (only where the receiver drops duplicates)
    retry_unanswered: bool = True

    def backoff(self, attempt: int) -> float:
        """The wait before try ``attempt + 1`` when the receiver named none (with jitter)."""
        return min(self.cap, self.base * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """Parse a Retry-After header: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or SYSTEM_CLOCK.now())).total_seconds())


def _not_sent(exc: requests.RequestException) -> bool:
    """True when the request surely never reached the receiver (no connection was made)."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    if isinstance(exc, requests.ConnectionError) and exc.args:
        reason = getattr(exc.args[0], "reason", None)
        return isinstance(reason, urllib3.exceptions.NewConnectionError)
    return False


def post_once(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    policy: RetryPolicy,
    attempt: int = 1,
    timeout: float | None = None,
    delivery_id: str = "",
    session: requests.Session | None = None,
    redact: Callable[[str], str] = lambda s: s,
) -> Delivery:
    """One try of a POST: the outcome says whether a later try may help (``retryable``), and
    whether the request may have arrived although no answer came (``unconfirmed``)."""
    register_url(url)  # a webhook's path and query are its credential: masked in every log line
    http = session or requests.Session()
    try:
        resp = http.post(
            url, data=body, headers=dict(headers), timeout=timeout or policy.timeout, allow_redirects=False
        )
    except requests.RequestException as exc:
        error = mask_text(redact(f"{type(exc).__name__}: {exc}"))  # stored with the action: no secret
        if _not_sent(exc) or policy.retry_unanswered:
            return Delivery(False, None, attempt, delivery_id, error, retryable=True)
        error = f"no answer ({error}): it may have arrived; not resent, since this receiver takes no idempotency key"
        return Delivery(False, None, attempt, delivery_id, error, unconfirmed=True)
    text = resp.text[:2000]
    if 200 <= resp.status_code < 300:
        return Delivery(True, resp.status_code, attempt, delivery_id, None, text)
    error = f"HTTP {resp.status_code}: {text[:200]}"
    retryable = resp.status_code == 429 or 500 <= resp.status_code < 600
    wait = retry_after_seconds(resp.headers.get("Retry-After")) if retryable else None
    return Delivery(False, resp.status_code, attempt, delivery_id, error, text, retryable=retryable, retry_after=wait)


def post_with_retries(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    policy: RetryPolicy,
    delivery_id: str = "",
    session: requests.Session | None = None,
    sleep: Callable[[float], None] = time.sleep,
    redact: Callable[[str], str] = lambda s: s,
    monotonic: Callable[[], float] = time.monotonic,
) -> Delivery:
    """POST ``body`` to ``url`` under ``policy``; never raises for HTTP or network failures."""
    http = session or requests.Session()
    began = monotonic()
    attempt = 1
    while True:
        left = policy.deadline - (monotonic() - began)
        d = post_once(
            url,
            body,
            headers,
            policy=policy,
            attempt=attempt,
            timeout=max(0.01, min(policy.timeout, left)),
            delivery_id=delivery_id,
            session=http,
            redact=redact,
        )
        if d.ok or not d.retryable:
            return d
        if d.retry_after is not None and d.retry_after > policy.max_wait:
            # The receiver asks for longer than we may block: give up now, honestly.
            return dataclasses.replace(d, error=f"{d.error} (Retry-After too long)")
        if attempt >= policy.attempts:
            return d
        wait = d.retry_after if d.retry_after is not None else policy.backoff(attempt)
        if monotonic() - began + wait >= policy.deadline:
            return dataclasses.replace(
                d, error=f"{d.error} (gave up after {attempt} attempt(s): deadline of {policy.deadline:g} s)"
            )
        sleep(wait)
        attempt += 1
