"""A generic JSON webhook, signed with HMAC-SHA256.

Body (``version`` 1; documented in docs/policies.md)::

    {"version": 1, "id": "<delivery uuid>", "kind": "<what happened>", "sent_at": "<RFC 3339>",
     "data": {...}}

Header ``X-Gpu-Auditor-Signature: sha256=<hex HMAC-SHA256 of the exact body bytes, keyed by the
shared secret>``; also ``X-Gpu-Auditor-Delivery`` and ``Idempotency-Key`` (the id, equal across
retries and resends: a receiver drops a second delivery of one id) and ``X-Gpu-Auditor-Kind``.
A receiver verifies with :func:`verify_signature` (constant-time compare) and may reject old
``sent_at`` values to stop replays.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from datetime import datetime, timezone
from typing import Callable

import requests

from auditor.clock import SYSTEM_CLOCK
from auditor.notify.http import Delivery, RetryPolicy, post_with_retries

WEBHOOK_BODY_VERSION = 1
SIGNATURE_HEADER = "X-Gpu-Auditor-Signature"


def sign(secret: str | bytes, body: bytes) -> str:
    """The signature header value for ``body``: ``sha256=<hex>``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def verify_signature(secret: str | bytes, body: bytes, header_value: str | None) -> bool:
    """True when ``header_value`` is the valid signature of ``body`` (constant-time)."""
    if not header_value:
        return False
    return hmac.compare_digest(sign(secret, body), header_value.strip())


class WebhookNotifier:
    """POST signed JSON events to one URL: ``send(kind, payload) -> Delivery``."""

    def __init__(
        self,
        url: str,
        secret: str | bytes,
        *,
        retry: RetryPolicy | None = None,
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], datetime] = SYSTEM_CLOCK.now,
    ) -> None:
        if not url.startswith(("https://", "http://")):
            raise ValueError("a webhook URL must be http(s)")
        if not secret:
            raise ValueError("a webhook needs a signing secret")
        self.url = url
        self._secret = secret
        self.retry = retry or RetryPolicy()
        self._session = session
        self._sleep = sleep
        self._clock = clock

    def __repr__(self) -> str:
        return f"WebhookNotifier({self.url.split('?')[0]!r})"

    def body(self, kind: str, payload: dict, delivery_id: str) -> bytes:
        """The exact bytes sent (and signed) for one event."""
        doc = {
            "version": WEBHOOK_BODY_VERSION,
            "id": delivery_id,
            "kind": kind,
            "sent_at": self._clock().astimezone(timezone.utc).isoformat().replace("+00:00", "Z"),
            "data": payload,
        }
        return json.dumps(doc, ensure_ascii=False, sort_keys=True, default=str).encode()

    def send(self, kind: str, payload: dict, *, delivery_id: str | None = None) -> Delivery:
        """Deliver one event; retries 5xx/429/network errors with backoff, never other 4xx."""
        did = delivery_id or str(uuid.uuid4())
        body = self.body(kind, payload, did)
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            SIGNATURE_HEADER: sign(self._secret, body),
            "X-Gpu-Auditor-Delivery": did,
            # the same id under the name of the IETF draft (draft-ietf-httpapi-idempotency-key-header)
            "Idempotency-Key": did,
            "X-Gpu-Auditor-Kind": kind,
            "User-Agent": "gpu-auditor",
        }
        return post_with_retries(
            self.url, body, headers, policy=self.retry, delivery_id=did, session=self._session, sleep=self._sleep
        )
