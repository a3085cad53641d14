"""Slack Block Kit blocks, and escaping of every user-controlled string that goes into them.

Pure functions (no I/O), shared by the policy alerts, the weekly report's Slack message and the
Slack notifier, so every message escapes the same way. Slack's mrkdwn treats ``<...>`` as links
and mentions (``<!channel>``, ``<@U123>``, ``<#C1>``, ``<!subteam^S1>``) and ``&`` as the start
of an entity. Slack's own rule is to escape exactly ``&``, ``<`` and ``>``; after that no control
sequence can be formed from user text. Plain ``@channel`` words are not mentions in webhook
messages (we never set ``link_names``), but we also break them with a zero-width joiner so a
later ``link_names`` cannot revive them.
"""

from __future__ import annotations

import re

_BROADCAST = re.compile(r"@(channel|here|everyone)\b", re.IGNORECASE)
#: Slack refuses section text longer than 3000 characters and messages over 50 blocks.
MAX_SECTION = 3000
MAX_BLOCKS = 50


def slack_escape(value: object) -> str:
    """Make any value safe to embed in Slack mrkdwn or plain text: no links, mentions or entities."""
    s = "" if value is None else str(value)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _BROADCAST.sub(lambda m: "@\u2060" + m.group(1), s)


def truncate(text: str, limit: int = MAX_SECTION) -> str:
    """Cut ``text`` to Slack's limit without leaving half an entity (``&am``) at the end."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    amp = cut.rfind("&")
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp]
    return cut + "…"


def section(mrkdwn: str) -> dict:
    """A Block Kit section block; ``mrkdwn`` must already be escaped where it holds user text."""
    return {"type": "section", "text": {"type": "mrkdwn", "text": truncate(mrkdwn)}}


def fields(pairs: list[tuple[str, object]]) -> dict:
    """A section of up to 10 ``*label*\\nvalue`` fields; values are escaped here."""
    return {
        "type": "section",
        "fields": [
            {"type": "mrkdwn", "text": truncate(f"*{slack_escape(k)}*\n{slack_escape(v)}", 2000)} for k, v in pairs[:10]
        ],
    }


def header(text: str) -> dict:
    """A Block Kit header (plain text, max 150 characters); escaped here."""
    return {"type": "header", "text": {"type": "plain_text", "text": truncate(slack_escape(text), 150)}}


def context(mrkdwn: str) -> dict:
    """A small grey context line; ``mrkdwn`` must already be escaped where it holds user text."""
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": truncate(mrkdwn)}]}
