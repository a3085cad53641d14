"""Slack incoming webhooks: posting Block Kit messages (the blocks and their escaping are in
:mod:`auditor.render.slack_blocks`)."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Callable

import requests

from auditor.notify.http import Delivery, RetryPolicy, post_with_retries
from auditor.render.slack_blocks import MAX_BLOCKS, truncate


class SlackNotifier:
    """Post to one Slack incoming-webhook URL.

    ``send(text, blocks)``: ``text`` is the notification fallback, ``blocks`` the Block Kit
    layout. Neither is escaped here (the caller may want real links); build user-controlled parts
    with :func:`~auditor.render.slack_blocks.slack_escape` or the block helpers of
    :mod:`auditor.render.slack_blocks`, which escape their values.
    """

    def __init__(
        self,
        url: str,
        *,
        retry: RetryPolicy | None = None,
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not url.startswith(("https://", "http://")):
            raise ValueError("a Slack webhook URL must be http(s)")
        self.url = url
        # Slack's incoming webhooks take no idempotency key: a POST that got no answer may have
        # posted the message, and sending it again would post it twice
        self.retry = dataclasses.replace(retry or RetryPolicy(), retry_unanswered=False)
        self._session = session
        self._sleep = sleep

    def __repr__(self) -> str:  # the URL is a secret: never print it
        return "SlackNotifier(<webhook url>)"

    def send(self, text: str, blocks: list[dict] | None = None) -> Delivery:
        """Deliver one message; retries 5xx/429 and requests that never left, never one that got
        no answer (it is *unconfirmed*); never raises for delivery failures."""
        payload: dict = {"text": truncate(text, 3000), "unfurl_links": False, "unfurl_media": False}
        if blocks:
            payload["blocks"] = blocks[:MAX_BLOCKS]
        body = json.dumps(payload, ensure_ascii=False).encode()
        return post_with_retries(
            self.url,
            body,
            {"Content-Type": "application/json; charset=utf-8"},
            policy=self.retry,
            delivery_id=str(uuid.uuid4()),
            session=self._session,
            sleep=self._sleep,
            redact=lambda s: s.replace(self.url, "<webhook url>"),
        )
