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
import threading
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import unquote

import requests
import urllib3
from prometheus_api_client import PrometheusConnect
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from auditor import redact
from auditor.errors import BadInput, QueryRefused, QueryTooLarge, SourceUnavailable
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
        self._timeouts = (min(10.0, self.timeout), self.timeout + 5)
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

    # -- raw calls ---------------------------------------------------------------------------
    def call(
        self,
        path: str,
        params: Mapping[str, Any] | list[tuple[str, str]],
        *,
        method: str = "POST",
        convert: Callable[[Any], Any] | None = None,
        raw: Callable[[bytes], Any] | None = None,
    ) -> Any:
        """Call ``/api/v1/<path>`` and return its ``data``; raise our errors on failure.

        With ``convert``, return ``convert(data)`` instead, run while holding the decode lock:
        answers are decoded one at a time (decoding holds the GIL anyway, so this costs no
        speed), and a large decoded answer is turned into something compact before the next
        one is decoded, so concurrent queries do not hold several decoded answers at once.
        ``raw`` (with ``convert``) reads a successful answer's body itself, under the same lock,
        where that is cheaper than JSON objects; where it returns None (a body it does not
        read) the answer is decoded and converted as without it.
        """
        url = f"{self.url}/api/v1/{path}"
        with self._lock:
            self.queries += 1
        try:
            if method == "GET":
                resp = self.session.get(url, params=params, timeout=self._timeouts, verify=self.session.verify)
            else:
                resp = self.session.post(url, data=params, timeout=self._timeouts, verify=self.session.verify)
        except requests.exceptions.SSLError as exc:
            raise SourceUnavailable(
                f"Prometheus at {self.url}: TLS failed ({exc.__class__.__name__}); "
                "give the server's CA with --prometheus-ca-file, or --prometheus-insecure to skip verification"
            ) from exc
        except requests.exceptions.Timeout as exc:
            raise SourceUnavailable(
                f"Prometheus at {self.url} did not answer within {self.timeout:g}s ({path})"
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
            if raw is not None and resp.status_code == 200:
                got = raw(resp.content)
                if got is not None:
                    return got
            data = self._decode(resp, path)
            return convert(data) if convert is not None else data

    def _decode(self, resp: requests.Response, path: str) -> Any:
        try:
            body = _loads(resp.content)
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
        if status != 200 or not isinstance(body, dict) or body.get("status") != "success":
            text = error or resp.text[:300].strip()
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
                f"Prometheus at {self.url} refused the query ({path}, HTTP {status}): {error or resp.text[:300]}"
            )
        if status in (401, 403):
            hint = "check the bearer token or basic-auth credentials"
            if "org id" in resp.text.lower():  # Mimir/Cortex: "no org id"
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
            detail = error or resp.text[:300].strip()
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
    ) -> Any:
        params = {"query": expr, "timeout": f"{self.timeout:g}s", **STRICT}
        if at_ms is not None:
            params["time"] = promql.format_ts(at_ms)
        return self.call("query", params, convert=convert, raw=raw)

    def query_range(
        self,
        expr: str,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        convert: Callable[[Any], Any] | None = None,
        raw: Callable[[bytes], Any] | None = None,
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
    m = re.search(r"(NameResolutionError|Failed to resolve|Connection refused|timed out|Max retries exceeded)", text)
    return m.group(1) if m else exc.__class__.__name__
