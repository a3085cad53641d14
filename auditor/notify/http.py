"""One careful HTTP POST with retries, shared by the notifiers.

Retry policy (the same for Slack and the generic webhook, and documented in docs/policies.md):
- a network error, a timeout, any 5xx and 429 are retried, with exponential backoff and jitter;
- ``Retry-After`` (seconds or an HTTP date) on a 429 or 503 is honoured, capped by ``max_wait``;
- any other 4xx is final at once: the request itself is wrong and repeating it cannot help;
- 2xx is success. At most ``attempts`` tries in all.
The delivery id stays the same across retries so a receiver can drop duplicates.
"""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Mapping

import requests

from auditor.clock import SYSTEM_CLOCK


@dataclass(frozen=True)
class Delivery:
    """The outcome of one notification: delivered or not, after how many attempts, and why."""

    ok: bool
    status: int | None
    attempts: int
    delivery_id: str = ""
    error: str | None = None
    response_body: str = field(default="", repr=False)

    def as_dict(self) -> dict:
        """A JSON-ready record (stored as an action's result)."""
        return {
            "ok": self.ok,
            "status": self.status,
            "attempts": self.attempts,
            "delivery_id": self.delivery_id,
            "error": self.error,
        }


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: attempts in all, backoff base and cap, longest Retry-After honoured."""

    attempts: int = 4
    base: float = 0.5
    cap: float = 10.0
    max_wait: float = 60.0
    timeout: float = 10.0


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
) -> Delivery:
    """POST ``body`` to ``url`` under ``policy``; never raises for HTTP or network failures."""
    http = session or requests.Session()
    last_status: int | None = None
    last_error: str | None = None
    text = ""
    for attempt in range(1, policy.attempts + 1):
        wait: float | None = None
        try:
            resp = http.post(url, data=body, headers=dict(headers), timeout=policy.timeout, allow_redirects=False)
        except requests.RequestException as exc:
            last_status, last_error = None, redact(f"{type(exc).__name__}: {exc}")
        else:
            last_status, text = resp.status_code, resp.text[:2000]
            if 200 <= resp.status_code < 300:
                return Delivery(True, resp.status_code, attempt, delivery_id, None, text)
            last_error = f"HTTP {resp.status_code}: {text[:200]}"
            if resp.status_code != 429 and not 500 <= resp.status_code < 600:
                return Delivery(False, resp.status_code, attempt, delivery_id, last_error, text)
            wait = retry_after_seconds(resp.headers.get("Retry-After"))
            if wait is not None and wait > policy.max_wait:
                # The receiver asks for longer than we may block: give up now, honestly.
                return Delivery(
                    False, resp.status_code, attempt, delivery_id, last_error + " (Retry-After too long)", text
                )
        if attempt == policy.attempts:
            break
        if wait is None:
            wait = min(policy.cap, policy.base * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
        sleep(wait)
    return Delivery(False, last_status, policy.attempts, delivery_id, last_error, text)
