"""Credentials out of everything we print or log: one masker for every URL, and the log filter.

Credentials reach us inside URLs (``http://user:pw@prometheus:9090``, a store's
``postgresql://user:pw@db/x``, a Slack webhook whose path *is* the secret, ``?token=`` query
parameters) and as configured secrets (a bearer token, a webhook signing key). Any message may
end up naming one: a CLI error, ``doctor``'s report, an operator log line, a third-party
library's debug log (urllib3 logs each request's path at ``-vv``). So instead of trusting every
message to be careful, every line the program writes passes :func:`mask_text`: the CLI's error
lines, and every log record through :class:`RedactingFormatter` on the root handler, which
sees the records of third-party loggers too.

Stdlib only, and no project imports, so every layer may use it (adapters may not import each
other, and this is not any adapter's business).
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Callable
from urllib.parse import urlsplit

MASK = "***"

#: query parameters that carry a credential (compared case-insensitively, ``-`` as ``_``)
SECRET_PARAMS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "pass",
        "token",
        "access_token",
        "id_token",
        "refresh_token",
        "auth",
        "authorization",
        "api_key",
        "apikey",
        "key",
        "secret",
        "client_secret",
        "sig",
        "signature",
        "x_amz_signature",
        "x_amz_credential",
        "x_amz_security_token",
        "x_goog_signature",
        "code",
    }
)
_PARAM = re.compile(r"([?&;]([A-Za-z0-9_.-]+)=)([^&;#\s'\"<>),\]]*)")
_AUTHORITY = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#\s]*)")
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
#: a Slack incoming webhook: the path after /services/ is the credential
_SLACK_PATH = re.compile(r"(/services/)[A-Za-z0-9_-]+(?:/[A-Za-z0-9_-]+)*")
#: a secret shorter than this is not looked for in free text (it would mask ordinary words)
MIN_SECRET = 6
#: a URL path segment at least this long is taken for a token (a webhook's secret path)
TOKEN_SEGMENT = 12

_secrets: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Mask ``value`` wherever it appears from now on (a bearer token, a password, a key)."""
    if value and len(value) >= MIN_SECRET:
        with _lock:
            _secrets.add(value)


def register_url(url: str | None) -> None:
    """Mask this URL's credentials wherever they appear, even without the URL around them:
    its password and, for a URL whose path or query is the secret (a webhook), those too, since
    urllib3's debug log prints a request's path without the host."""
    if not url:
        return
    try:
        parts = urlsplit(url)
        register_secret(parts.password)
    except ValueError:
        return
    if parts.query:
        register_secret(parts.query)
    # a path is a secret only where a segment looks like a token (``/hooks/9f3c1a…``); an
    # ordinary path (``/api/v1/alerts``) masked everywhere would only hide what a log says
    if any(len(segment) >= TOKEN_SEGMENT for segment in parts.path.split("/")):
        register_secret(parts.path + (f"?{parts.query}" if parts.query else ""))
        register_secret(parts.path)


def mask_url(url: str) -> str:
    """``url`` with its password, secret query parameters and a webhook's secret path masked.

    The user name stays (it says *who*, which helps, and is not a secret by itself). Masked in
    place, never re-assembled, so the rest of the URL is byte for byte what was given.
    """
    m = _AUTHORITY.match(url)
    if m and "@" in m.group(2):
        userinfo, _, host = m.group(2).rpartition("@")
        user, colon, _ = userinfo.partition(":")
        if colon:
            url = f"{m.group(1)}{user}:{MASK}@{host}{url[m.end() :]}"
    return _mask_patterns(url)


def mask_text(text: str) -> str:
    """Every URL in ``text`` through :func:`mask_url`, then the registered secrets and the
    URL-less forms (a webhook path or ``?token=`` in a log of a request line) masked."""
    if "://" in text:
        text = _URL.sub(lambda m: mask_url(m.group(0)), text)
    text = _mask_patterns(text)
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for s in secrets:
        if s in text:
            text = text.replace(s, MASK)
    return text


def _mask_param(m: re.Match[str]) -> str:
    name = m.group(2).lower().replace("-", "_")
    return m.group(1) + MASK if name in SECRET_PARAMS and m.group(3) else m.group(0)


def _mask_patterns(text: str) -> str:
    text = _SLACK_PATH.sub(rf"\g<1>{MASK}", text) if "/services/" in text else text
    text = _PARAM.sub(_mask_param, text) if "=" in text else text
    return text


class RedactingFormatter(logging.Formatter):
    """Formats as the formatter it wraps, then masks the whole line, traceback included. With
    ``clean`` (the CLI's neutraliser of control characters) the message itself passes through it
    first: a message may quote a pod name, and a newline in one would forge a log line; the
    traceback's own lines stay lines."""

    def __init__(self, inner: logging.Formatter | None = None, clean: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()
        self.clean = clean

    def format(self, record: logging.LogRecord) -> str:
        if self.clean is not None:
            record = logging.makeLogRecord(record.__dict__)  # the other handlers get it as it was
            record.msg, record.args = self.clean(record.getMessage()), None
        return mask_text(self.inner.format(record))


def install(logger: logging.Logger | None = None, clean: Callable[[str], str] | None = None) -> None:
    """Wrap the formatter of each handler of ``logger`` (the root logger by default) in a
    :class:`RedactingFormatter`: every record that reaches them is masked, whoever logged it."""
    for handler in (logger or logging.getLogger()).handlers:
        if not isinstance(handler.formatter, RedactingFormatter):
            handler.setFormatter(RedactingFormatter(handler.formatter, clean))
