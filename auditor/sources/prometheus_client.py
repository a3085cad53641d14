"""The Prometheus HTTP API client: one ``requests`` session, strict errors, counted calls.

HTTP goes through one session configured for prometheus-api-client's :class:`PrometheusConnect`
(auth, TLS, bounded retries on 429/5xx). Queries are sent through that session directly rather
than through ``custom_query``, because the client drops the response's ``warnings`` (Thanos
partial responses, for one), which an audit must not ignore: a warning that is not a PromQL
annotation means data may be missing, and the answer is refused. What to ask is the source's
business (:mod:`auditor.sources.prometheus`); this module only asks and decodes.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import unquote

import requests
import urllib3
from prometheus_api_client import PrometheusConnect
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from auditor import redact
from auditor.errors import (
    AnswerTooLarge,
    BadInput,
    MalformedAnswer,
    QueryRefused,
    QueryTooLarge,
    SourceUnavailable,
)
from auditor.sources import promql

_loads: Callable[[bytes | str], Any]
try:  # several times faster on the multi-megabyte answers of a large cluster
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - the stdlib decoder gives the same result, slower
    import json

    _loads = json.loads

log = logging.getLogger(__name__)

RETRY_STATUSES = (429, 500, 502, 503, 504)
#: response warnings that are PromQL annotations about the query (util/annotations in
#: Prometheus), not about missing data; any other warning means the data may be incomplete
ANNOTATION_PREFIXES = ("PromQL info", "PromQL warning")
#: sent with every query: Thanos then fails a query that would miss a store's data instead of
#: answering part of it (Prometheus and other engines ignore the parameter)
STRICT = {"partial_response": "false"}

#: The size limits of the engines that speak the Prometheus query API, by the words of their
#: errors (the status differs: 422 or 400 from Prometheus and Mimir, 422 from VictoriaMetrics, a
#: 4xx or 5xx from Thanos depending on the component), and which kind of limit each is.
LIMIT_ERRORS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.I), limit)
    for pattern, limit in (
        # Prometheus: --query.max-samples, and 11,000 points per series in a range query
        (r"query processing would load too many samples|too many samples", "samples"),
        (r"exceeded maximum resolution of [\d,]+ points per timeseries", "points"),
        # Mimir (and Cortex): err-mimir-max-query-length, -max-total-query-length, chunks, series
        (r"the (total )?query time range exceeds the limit", "length"),
        (r"the query exceeded the (maximum number of (estimated )?chunks|aggregated chunks size limit)", "samples"),
        (r"the query exceeded the maximum number of series", "series"),
        # Thanos store/querier limits (store.limits.request-samples / -series)
        (r"exceeded (samples|chunks) limit", "samples"),
        (r"exceeded series limit", "series"),
        # VictoriaMetrics: -search.maxSamplesPerQuery, -search.maxPointsPerTimeseries, -search.maxUniqueTimeseries
        (r"cannot select more than -search\.maxSamplesPerQuery", "samples"),
        (r"too many points for the given start=.*the maximum number of points is", "points"),
        (r"the number of matching timeseries exceeds|-search\.maxUniqueTimeseries", "series"),
    )
)


#: Where a series begins in a matrix or vector answer: its ``metric`` key and the object after
#: it. Nothing else in an answer matches: a label *named* metric has a string value, a value
#: "metric" is followed by a comma or a brace, and inside a JSON string every quote is escaped.
_SERIES_START = re.compile(rb'"metric"\s{0,8}:\s{0,8}\{')
#: bytes of one chunk kept to find a series start that spans two chunks (longer than a match)
_OVERLAP = 32
#: the body is read in chunks of this size, counted as they arrive
_CHUNK = 1 << 20
#: an answer's whole time beyond ``timeout`` (the server's own bound on evaluating the query)
#: when ``answer_deadline`` is not given: the time to send the answer
DEADLINE_MARGIN_S = 30.0

#: the defaults of the bounds on one read (settings ``prometheus.max_series_per_answer``,
#: ``max_series_per_cycle``, ``max_read_memory_mb``; docs/scale.md, "Bounds"). An operator shard
#: serves ~10,000 GPUs (MIG: up to 7 instances each); a cycle reads ~12 exporter names.
MAX_SERIES_PER_ANSWER = 50_000
MAX_SERIES_PER_CYCLE = 500_000
MAX_READ_MEMORY_MB = 2048


class SeriesCounter:
    """The series of an answer counted as its body arrives, chunk by chunk (a series' start may
    span two chunks: the last bytes of one are searched again with the next)."""

    def __init__(self) -> None:
        self.count = 0
        self._tail = b""

    def feed(self, chunk: bytes) -> int:
        """Count the series that begin in ``chunk``; the total so far."""
        buf = self._tail + chunk
        seen = len(self._tail)
        self.count += sum(1 for m in _SERIES_START.finditer(buf) if m.end() > seen)
        self._tail = buf[-_OVERLAP:]
        return self.count


def limit_of(error: str) -> str | None:
    """Which size limit an engine's error text names (``samples``, ``points``, ``length``, ``series``), if any."""
    for pattern, limit in LIMIT_ERRORS:
        if pattern.search(error):
            return limit
    return None


class PrometheusClient:
    """A small, strict Prometheus HTTP API client: errors become our exception types.

    ``timeout`` is both the client's read timeout and the server-side query ``timeout``;
    ``retries`` bounds re-tries on connection failures and on HTTP 429/5xx only (a 400/422 is the
    query's fault and is never retried). Every API call is counted in :attr:`queries`, and
    response ``warnings`` are collected in :attr:`warnings`.

    Bounds (issue 35): ``answer_deadline`` is the whole of one answer's time, headers and body
    (default ``timeout`` + :data:`DEADLINE_MARGIN_S`): a server that sends a body slower than
    that, or less of it than its Content-Length says and then nothing, is cut off then, not
    after a read timeout per read. The series of a query's answer are counted as its body
    arrives, and the read stops as soon as they pass ``max_series_per_answer``, or the series
    of the cycle's read (:meth:`begin_read`) pass ``max_series_per_cycle``, or the statistics
    the read would hold for them pass ``max_read_memory_mb``: before the rest is read or any of
    it decoded, naming the selector. A body (decompressed) larger than ``max_read_memory_mb`` is
    refused too, whatever its series.
    """

    def __init__(
        self,
        url: str,
        *,
        bearer_token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        ca_file: str | None = None,
        insecure: bool = False,
        timeout: float = 60.0,
        retries: int = 2,
        backoff: float = 0.5,
        tenant: str | None = None,
        answer_deadline: float | None = None,
        max_series_per_answer: int = MAX_SERIES_PER_ANSWER,
        max_series_per_cycle: int = MAX_SERIES_PER_CYCLE,
        max_read_memory_mb: int = MAX_READ_MEMORY_MB,
    ) -> None:
        if not re.match(r"^https?://[^/]+", url or ""):
            raise BadInput(f"--prometheus: {url!r} is not an http(s) URL (e.g. http://prometheus:9090)")
        url, in_url = split_credentials(url)
        if in_url is not None:
            if basic_auth or bearer_token:
                raise BadInput("--prometheus: credentials in the URL and a token or user flag; give one of them")
            basic_auth = in_url
        if bearer_token and basic_auth:
            raise BadInput("Prometheus auth: give a bearer token or basic auth, not both")
        redact.register_secret(bearer_token)
        redact.register_secret(basic_auth[1] if basic_auth else None)
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.deadline = float(answer_deadline) if answer_deadline else self.timeout + DEADLINE_MARGIN_S
        self._timeouts = (min(10.0, self.timeout, self.deadline), min(self.timeout + 5, self.deadline))
        self.max_series_per_answer = int(max_series_per_answer)
        self.max_series_per_cycle = int(max_series_per_cycle)
        self.max_read_bytes = int(max_read_memory_mb) << 20
        #: selector → (the most series one of its answers had, bytes the read holds per series)
        #: in the current read: the four aggregates and the time-split parts of one exporter
        #: name carry the same series, so a selector counts once, by its largest answer
        self._read_series: dict[str, tuple[int, int]] = {}
        self.queries = 0
        self.warnings: list[str] = []
        self._lock = threading.Lock()
        self._decode_lock = threading.Lock()
        session = requests.Session()
        if insecure:
            session.verify = False
            # one clear warning instead of urllib3's on every request
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            log.warning("TLS certificate verification is off for Prometheus at %s (--prometheus-insecure)", self.url)
        elif ca_file:
            session.verify = ca_file
        if bearer_token:
            session.headers["Authorization"] = f"Bearer {bearer_token}"
        if basic_auth:
            session.auth = basic_auth
        #: Mimir, Cortex, Thanos Receive/Query Frontend and Loki name the tenant by this header
        self.tenant = tenant or None
        if self.tenant:
            session.headers["X-Scope-OrgID"] = self.tenant
        retry = Retry(
            total=retries,
            connect=retries,
            read=0,
            status=retries,
            other=0,
            backoff_factor=backoff,
            status_forcelist=RETRY_STATUSES,
            allowed_methods=None,
            raise_on_status=False,
            respect_retry_after_header=True,
        )
        # PrometheusConnect mounts the retrying adapter on our URL; we keep the session.
        self.connect = PrometheusConnect(url=self.url, session=session, retry=retry, timeout=self.timeout)
        session.mount(self.url, HTTPAdapter(max_retries=retry, pool_maxsize=16))
        # Passed per request too: requests lets REQUESTS_CA_BUNDLE override a session-level
        # verify setting (psf/requests#3829), which would silently ignore --prometheus-ca-file.
        self.session = session

    def close(self) -> None:
        self.session.close()

    def begin_read(self) -> None:
        """A new read (an audit's, an operator cycle's) starts: its series are counted afresh."""
        with self._lock:
            self._read_series = {}

    # -- raw calls ---------------------------------------------------------------------------
    def call(
        self,
        path: str,
        params: Mapping[str, Any] | list[tuple[str, str]],
        *,
        method: str = "POST",
        convert: Callable[[Any], Any] | None = None,
        raw: Callable[[bytes], Any] | None = None,
        selector: str | None = None,
        series_bytes: int = 0,
    ) -> Any:
        """Call ``/api/v1/<path>`` and return its ``data``; raise our errors on failure.

        With ``convert``, return ``convert(data)`` instead, run while holding the decode lock:
        answers are decoded one at a time (decoding holds the GIL anyway, so this costs no
        speed), and a large decoded answer is turned into something compact before the next
        one is decoded, so concurrent queries do not hold several decoded answers at once.
        ``raw`` (with ``convert``) reads a successful answer's body itself, under the same lock,
        where that is cheaper than JSON objects; where it returns None (a body it does not
        read) the answer is decoded and converted as without it. Either may raise
        :class:`~auditor.errors.MalformedAnswer` with what is wrong; it is raised again naming
        the server, the call and ``selector``.

        With ``selector`` (the series the query selects, named in errors), the answer's series
        are counted as its body arrives and bounded (the class's docstring), each one taken to
        hold ``series_bytes`` for the read (0: not counted in the cycle's series or memory).
        """
        url = f"{self.url}/api/v1/{path}"
        with self._lock:
            self.queries += 1
        deadline_at = time.monotonic() + self.deadline
        try:
            if method == "GET":
                resp = self.session.get(
                    url, params=params, timeout=self._timeouts, verify=self.session.verify, stream=True
                )
            else:
                resp = self.session.post(
                    url, data=params, timeout=self._timeouts, verify=self.session.verify, stream=True
                )
            content = self._body(resp, path, deadline_at, selector, series_bytes)
        except requests.exceptions.SSLError as exc:
            raise SourceUnavailable(
                f"Prometheus at {self.url}: TLS failed ({exc.__class__.__name__}); "
                "give the server's CA with --prometheus-ca-file, or --prometheus-insecure to skip verification"
            ) from exc
        except requests.exceptions.Timeout as exc:
            raise SourceUnavailable(
                f"Prometheus at {self.url} did not answer within {self.timeout:g}s ({path})"
            ) from exc
        except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError) as exc:
            # the headers came, the body broke off (fewer bytes than its Content-Length, a cut chunk)
            raise SourceUnavailable(
                f"Prometheus at {self.url} broke off its answer ({path}): {_root_reason(exc)}"
            ) from exc
        except requests.exceptions.RequestException as exc:
            if _read_timed_out(exc):  # reached, but no answer in time: not "unreachable"
                raise SourceUnavailable(
                    f"Prometheus at {self.url} did not answer within {self.timeout:g}s ({path}); "
                    "a heavy query: raise --prometheus-timeout or audit a shorter range"
                ) from exc
            reason = _root_reason(exc)
            raise SourceUnavailable(f"Prometheus at {self.url} is unreachable: {reason}") from exc
        with self._decode_lock:
            try:
                if raw is not None and resp.status_code == 200:
                    got = raw(content)
                    if got is not None:
                        return got
                data = self._decode(resp, content, path)
                return convert(data) if convert is not None else data
            except MalformedAnswer as exc:
                what = f" for {selector}" if selector else ""
                raise MalformedAnswer(
                    f"Prometheus at {self.url} answered {path}{what} with a malformed body: {exc}; nothing of it is stored"
                ) from None

    def _body(
        self, resp: requests.Response, path: str, deadline_at: float, selector: str | None, series_bytes: int
    ) -> bytes:
        """The whole body of ``resp``, read by the deadline (a watchdog shuts the socket down
        then: a server that trickles bytes, or sends fewer than its Content-Length and waits,
        blocks no read past it); with ``selector``, its series counted and bounded as they come."""
        fired = threading.Event()

        def stop() -> None:
            fired.set()
            sock = getattr(getattr(resp.raw, "connection", None), "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        left = deadline_at - time.monotonic()
        timer = threading.Timer(max(0.0, left), stop)
        timer.daemon = True
        timer.start()
        chunks: list[bytes] = []
        counter = SeriesCounter()
        counting = selector is not None and resp.status_code == 200
        size = 0
        try:
            for chunk in resp.iter_content(_CHUNK):
                chunks.append(chunk)
                size += len(chunk)
                if size > self.max_read_bytes:  # few series, but a body no read may hold (a gzip bomb)
                    what = f" for {selector}" if selector else ""
                    raise AnswerTooLarge(
                        f"Prometheus at {self.url} answered {path}{what} with more than "
                        f"{self.max_read_bytes >> 20:,} MiB (prometheus.max_read_memory_mb); the answer was dropped",
                        bound="prometheus.max_read_memory_mb",
                    )
                if counting and selector is not None:
                    self._check_series(path, selector, counter.feed(chunk), series_bytes)
        except requests.exceptions.RequestException:
            if fired.is_set():
                raise self._late(path) from None
            raise
        finally:
            timer.cancel()
            resp.close()
        if fired.is_set():
            raise self._late(path)
        return b"".join(chunks)

    def _late(self, path: str) -> SourceUnavailable:
        return SourceUnavailable(
            f"Prometheus at {self.url} did not send its whole answer ({path}) within {self.deadline:g}s "
            "(prometheus.answer_deadline); the answer was dropped"
        )

    def _check_series(self, path: str, selector: str, count: int, series_bytes: int) -> None:
        """Refuse an answer of ``count`` series so far of ``selector`` past the bounds."""
        advice = (
            "select fewer series per query with prometheus.matchers (--match) or run the operator in shards "
            "(docs/scale.md)"
        )
        if count > self.max_series_per_answer:
            raise AnswerTooLarge(
                f"Prometheus at {self.url} answered more than {self.max_series_per_answer:,} series for {selector} "
                f"({path}; prometheus.max_series_per_answer): {advice}, or raise the bound",
                bound="prometheus.max_series_per_answer",
            )
        if not series_bytes:
            return
        with self._lock:
            before, _ = self._read_series.get(selector, (0, series_bytes))
            if count <= before:
                return
            self._read_series[selector] = (count, series_bytes)
            total = sum(n for n, _ in self._read_series.values())
            held = sum(n * b for n, b in self._read_series.values())
        if total > self.max_series_per_cycle:
            raise AnswerTooLarge(
                f"Prometheus at {self.url} answered more than {self.max_series_per_cycle:,} series in one read, "
                f"{count:,} of them for {selector} ({path}; prometheus.max_series_per_cycle): {advice}, "
                "or raise the bound",
                bound="prometheus.max_series_per_cycle",
            )
        if held > self.max_read_bytes:
            raise AnswerTooLarge(
                f"the read would hold more than {self.max_read_bytes >> 20:,} MiB of statistics "
                f"({total:,} series so far over the range, {count:,} of them for {selector}; "
                "prometheus.max_read_memory_mb): audit a shorter range, with a wider --bucket, or fewer series "
                "(--match), or raise the bound",
                bound="prometheus.max_read_memory_mb",
            )

    def _decode(self, resp: requests.Response, content: bytes, path: str) -> Any:
        try:
            body = _loads(content)
        except ValueError:
            body = None
        error = ""
        if isinstance(body, dict):
            error = f"{body.get('errorType', 'error')}: {body.get('error', '')}".strip(": ")
            for w in body.get("warnings") or []:
                with self._lock:
                    if w not in self.warnings:
                        self.warnings.append(str(w))
        status = resp.status_code
        text300 = content[:300].decode("utf-8", "replace")
        if status != 200 or not isinstance(body, dict) or body.get("status") != "success":
            text = error or text300.strip()
            limit = limit_of(text)
            if limit is not None:
                advice = (
                    "; only fewer series per query helps: narrow with prometheus.matchers (--match) or "
                    "run the operator in shards (docs/scale.md)"
                    if limit == "series"
                    else ""
                )
                raise QueryTooLarge(
                    f"Prometheus at {self.url} refused the query for its size ({path}, HTTP {status}, "
                    f"{limit} limit): {text}{advice}",
                    limit=limit,
                )
        if status in (400, 422):
            raise QueryRefused(
                f"Prometheus at {self.url} refused the query ({path}, HTTP {status}): {error or text300}"
            )
        if status in (401, 403):
            hint = "check the bearer token or basic-auth credentials"
            if "org id" in content.decode("utf-8", "replace").lower():  # Mimir/Cortex: "no org id"
                hint = "it asks for a tenant: set prometheus.tenant (--prometheus-tenant), sent as X-Scope-OrgID"
            raise QueryRefused(f"Prometheus at {self.url} refused access (HTTP {status}); {hint}")
        if status == 404:
            raise SourceUnavailable(
                f"no Prometheus HTTP API at {self.url} (HTTP 404 for /api/v1/{path}); check the URL and path prefix"
            )
        if isinstance(body, dict) and body.get("errorType") == "timeout":  # Prometheus answers 503
            raise SourceUnavailable(
                f"Prometheus at {self.url} timed out evaluating the query ({path}, HTTP {status}): {error}; "
                "raise --prometheus-timeout or audit a shorter range"
            )
        if status != 200 or not isinstance(body, dict):
            detail = error or text300.strip()
            raise SourceUnavailable(f"Prometheus at {self.url} failed ({path}, HTTP {status}): {detail}")
        if body.get("status") != "success":
            raise QueryRefused(f"Prometheus at {self.url} answered {path} with an error: {error}")
        missing = [str(w) for w in body.get("warnings") or [] if not str(w).startswith(ANNOTATION_PREFIXES)]
        if missing:
            # a partial answer (a Thanos store, a remote-read endpoint or an ingester was not
            # heard): stored, it would read as idle GPUs or finished jobs, so nothing is kept
            raise SourceUnavailable(
                f"Prometheus at {self.url} answered {path} with incomplete data ({missing[0]}); "
                "nothing from a partial answer is stored: run the audit again when it answers in full"
            )
        return body.get("data")

    # -- API -------------------------------------------------------------------------------------
    def query(
        self,
        expr: str,
        at_ms: int | None = None,
        convert: Callable[[Any], Any] | None = None,
        raw: Callable[[bytes], Any] | None = None,
        selector: str | None = None,
        series_bytes: int = 0,
    ) -> Any:
        params = {"query": expr, "timeout": f"{self.timeout:g}s", **STRICT}
        if at_ms is not None:
            params["time"] = promql.format_ts(at_ms)
        return self.call(
            "query", params, convert=convert, raw=raw, selector=selector or expr, series_bytes=series_bytes
        )

    def query_range(
        self,
        expr: str,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        convert: Callable[[Any], Any] | None = None,
        raw: Callable[[bytes], Any] | None = None,
        selector: str | None = None,
        series_bytes: int = 0,
    ) -> Any:
        return self.call(
            "query_range",
            {
                "query": expr,
                "start": promql.format_ts(start_ms),
                "end": promql.format_ts(end_ms),
                "step": promql.format_ts(step_ms),
                "timeout": f"{self.timeout:g}s",
                **STRICT,
            },
            convert=convert,
            raw=raw,
            selector=selector or expr,
            series_bytes=series_bytes,
        )

    def label_values(self, label: str, match: Iterable[str], start_ms: int, end_ms: int) -> list[str]:
        params = [("match[]", m) for m in match]
        params += [("start", promql.format_ts(start_ms)), ("end", promql.format_ts(end_ms))]
        return list(self.call(f"label/{label}/values", params, method="GET") or [])

    def series(self, match: Iterable[str], start_ms: int, end_ms: int) -> list[dict[str, str]]:
        params = [("match[]", m) for m in match]
        params += [("start", promql.format_ts(start_ms)), ("end", promql.format_ts(end_ms))]
        return list(self.call("series", params) or [])

    def buildinfo(self) -> dict:
        """``/api/v1/status/buildinfo`` (Prometheus 2.14+); ``{}`` where a backend lacks it."""
        try:
            return dict(self.call("status/buildinfo", {}, method="GET") or {})
        except (SourceUnavailable, QueryRefused) as exc:
            if "HTTP 404" in str(exc) or "HTTP 405" in str(exc):
                return {}
            raise


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``http://user:pw@host/x`` → (``http://host/x``, (user, pw)); a URL without them as is.

    The credentials become basic auth (as ``requests`` would have sent them) and the URL the
    source keeps, which every message and log line names, no longer carries them.
    """
    scheme, sep, rest = url.partition("://")
    authority, slash, tail = rest.partition("/")
    if not sep or "@" not in authority:
        return url, None
    userinfo, _, host = authority.rpartition("@")
    user, _, password = userinfo.partition(":")
    return f"{scheme}://{host}{slash}{tail}", (unquote(user), unquote(password))


def _read_timed_out(exc: requests.exceptions.RequestException) -> bool:
    """A read timeout that the retrying adapter wrapped (``MaxRetryError(ReadTimeoutError)``,
    which requests raises as a ConnectionError): the server took the request and never answered."""
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(reason, urllib3.exceptions.ReadTimeoutError)


def _root_reason(exc: BaseException) -> str:
    """The innermost useful message of a requests/urllib3 exception chain (e.g. 'Connection refused')."""
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if m:
        return m.group(1).strip()
    m = re.search(
        r"(IncompleteRead\([^)]*\)|NameResolutionError|Failed to resolve|Connection refused|timed out|Max retries exceeded)",
        text,
    )
    return m.group(1) if m else exc.__class__.__name__
