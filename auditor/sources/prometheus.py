"""The Prometheus source: rollup buckets for every pod and GPU of a window, in a fixed number of queries.

How it reads (see :mod:`auditor.sources.promql` for the query shapes and boundary semantics):

1. one ``/api/v1/label/__name__/values`` call finds which DCGM exporter names (classic, DCGM
   4.6 and dcgm-exporter 4.9 names, :data:`auditor.core.metrics.EXPORTED`) have series in the
   window, and so the naming generation, which fixes each name's unit;
2. per present name, four ``query_range`` calls at ``step = width`` (sum, count, min and max
   ``_over_time``) return those aggregates of every series per aligned bucket ``[start, end)``,
   split by time only where the 11,000-points-per-series limit (or Prometheus's sample limit)
   demands it;
3. buckets whose min/max/sum betray garbage (NaN, negative, GPU_UTIL 4294967295, a small
   overshoot that must be clamped) are re-read as raw samples — only those series, only the span
   of those buckets — and aggregated here, dropping and counting the garbage.

So the number of queries depends on the metric names and the window length, never on the number
of pods or jobs. Label conventions (``pod`` vs ``exported_pod``, ``Hostname`` vs ``hostname``,
``UUID`` vs ``uuid``, MIG ``GPU_I_ID``) are detected from the series themselves.

HTTP goes through one ``requests`` session configured for prometheus-api-client's
:class:`PrometheusConnect` (auth, TLS, bounded retries on 429/5xx). Queries are sent through that
session directly rather than through ``custom_query``, because the client drops the response's
``warnings`` (Thanos partial responses, for one), which an audit must not ignore.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from array import array
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

import requests
import urllib3
from prometheus_api_client import PrometheusConnect
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from auditor.core.accumulate import interval_of
from auditor.core.metrics import BY_NAME, SPECS, UTIL_RATIO, Metric, Naming, detect_naming, scale_of
from auditor.core.model import Bucket, GpuId, PodRef, Window
from auditor.core.readings import SourceReport, SourceResult
from auditor.core.rollup import BucketRun, LazyBuckets, Piece, Sample, aggregate
from auditor.core.source_preference import prefer_one_source
from auditor.errors import BadInput, QueryRefused, SourceUnavailable
from auditor.sources import promql

_loads: Callable[[bytes | str], Any]
try:  # several times faster on the multi-megabyte answers of a large cluster
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - the stdlib decoder gives the same result, slower
    import json

    _loads = json.loads

log = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_TOO_MANY = re.compile(r"too many samples|exceeded maximum resolution", re.I)
RETRY_STATUSES = (429, 500, 502, 503, 504)
#: at most this many buckets of raw samples per garbage re-read query
RAW_SPAN_BUCKETS = 288
_NANS = array("d", [math.nan]) * 4096
_EMPTY = array("d")


def _dt(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def _ms(value: datetime) -> int:
    return (value - _EPOCH) // timedelta(milliseconds=1)


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
    ) -> None:
        if not re.match(r"^https?://[^/]+", url or ""):
            raise BadInput(f"--prometheus: {url!r} is not an http(s) URL (e.g. http://prometheus:9090)")
        if bearer_token and basic_auth:
            raise BadInput("Prometheus auth: give a bearer token or basic auth, not both")
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
    ) -> Any:
        """Call ``/api/v1/<path>`` and return its ``data``; raise our errors on failure.

        With ``convert``, return ``convert(data)`` instead, run while holding the decode lock:
        answers are decoded one at a time (decoding holds the GIL anyway, so this costs no
        speed), and a large decoded answer is turned into something compact before the next
        one is decoded, so concurrent queries do not hold several decoded answers at once.
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
            reason = _root_reason(exc)
            raise SourceUnavailable(f"Prometheus at {self.url} is unreachable: {reason}") from exc
        with self._decode_lock:
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
        if status in (400, 422):
            raise QueryRefused(
                f"Prometheus at {self.url} refused the query ({path}, HTTP {status}): {error or resp.text[:300]}"
            )
        if status in (401, 403):
            raise QueryRefused(
                f"Prometheus at {self.url} refused access (HTTP {status}); check the bearer token or basic-auth credentials"
            )
        if status == 404:
            raise SourceUnavailable(
                f"no Prometheus HTTP API at {self.url} (HTTP 404 for /api/v1/{path}); check the URL and path prefix"
            )
        if status != 200 or not isinstance(body, dict):
            detail = error or resp.text[:300].strip()
            raise SourceUnavailable(f"Prometheus at {self.url} failed ({path}, HTTP {status}): {detail}")
        if body.get("status") != "success":
            raise QueryRefused(f"Prometheus at {self.url} answered {path} with an error: {error}")
        return body.get("data")

    # -- API -------------------------------------------------------------------------------------
    def query(self, expr: str, at_ms: int | None = None) -> dict:
        params = {"query": expr, "timeout": f"{self.timeout:g}s"}
        if at_ms is not None:
            params["time"] = promql.format_ts(at_ms)
        return self.call("query", params)

    def query_range(
        self, expr: str, start_ms: int, end_ms: int, step_ms: int, convert: Callable[[Any], Any] | None = None
    ) -> Any:
        return self.call(
            "query_range",
            {
                "query": expr,
                "start": promql.format_ts(start_ms),
                "end": promql.format_ts(end_ms),
                "step": promql.format_ts(step_ms),
                "timeout": f"{self.timeout:g}s",
            },
            convert=convert,
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


def _root_reason(exc: BaseException) -> str:
    """The innermost useful message of a requests/urllib3 exception chain (e.g. 'Connection refused')."""
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if m:
        return m.group(1).strip()
    m = re.search(r"(NameResolutionError|Failed to resolve|Connection refused|timed out|Max retries exceeded)", text)
    return m.group(1) if m else exc.__class__.__name__


@dataclass
class ReadStats:
    """Details of the last read beyond :class:`SourceReport`, for ``doctor``."""

    version: str = ""
    names: list[str] = field(default_factory=list)
    #: device keys (UUID or UUID/GPU_I_ID) seen, and those with a workload pod
    gpus: set[str] = field(default_factory=set)
    attributed: set[str] = field(default_factory=set)
    #: hostname → metrics seen there (for per-node presence checks)
    hosts: dict[str, set[Metric]] = field(default_factory=dict)
    mig: bool = False
    exporter_pods: set[str] = field(default_factory=set)
    #: the exporter naming generation detected (auditor.core.metrics.Naming), and why
    naming: Naming = Naming.CLASSIC
    naming_why: str = ""


@dataclass
class _Series:
    name: str
    metric: Metric
    labels: dict[str, str]
    #: aggregate ("sum", "count", "min", "max") → raw value per bucket of the read (NaN: none)
    aggs: dict[str, array] = field(default_factory=dict)


class PrometheusSource:
    """:class:`~auditor.ports.MetricSource` over a Prometheus-compatible query API.

    ``matchers`` are extra label equalities added to every selector (e.g. ``{"cluster": "prod"}``
    where several clusters share one Prometheus/Thanos). ``pod_labels`` forces a convention
    (``"pod"``, ``"exported_pod"`` or ``"pod_name"``) instead of detecting it.
    ``max_points`` is the points-per-series limit to split under (11,000 in Prometheus).
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
        matchers: Mapping[str, str] | None = None,
        pod_labels: str | None = None,
        metrics: Iterable[Metric] | None = None,
        max_points: int = promql.MAX_POINTS_PER_SERIES,
        concurrency: int = 4,
    ) -> None:
        self.client = PrometheusClient(
            url,
            bearer_token=bearer_token,
            basic_auth=basic_auth,
            ca_file=ca_file,
            insecure=insecure,
            timeout=timeout,
            retries=retries,
        )
        self.url = self.client.url
        self.matchers = dict(matchers or {})
        self.forced: promql.LabelConvention | None = None
        if pod_labels:
            conv = [c for c in promql.POD_CONVENTIONS if c[0] == pod_labels]
            if not conv:
                raise BadInput(f"pod label convention {pod_labels!r}: use pod, exported_pod or pod_name")
            self.forced = promql.LabelConvention(*conv[0])
        self.metrics = tuple(metrics) if metrics is not None else tuple(SPECS)
        self.max_points = max(2, int(max_points))
        self.concurrency = max(1, int(concurrency))
        self._major: int | None = None
        #: the interval the last read with a full bucket measured (a short window may have none)
        self._interval: float | None = None
        self.stats = ReadStats()

    def close(self) -> None:
        self.client.close()

    # -- the MetricSource protocol ---------------------------------------------------------------
    def read(self, window: Window, width: timedelta) -> SourceResult:
        result = self.read_lazy(window, width)
        result.buckets = list(result.buckets)
        return result

    def read_lazy(self, window: Window, width: timedelta) -> SourceResult:
        """:meth:`read`, with ``buckets`` a :class:`~auditor.core.rollup.LazyBuckets`: the same
        buckets in the same order, made into objects only when iterated or per pod (the engine
        keeps one job's buckets as objects at a time)."""
        width_ms = int(width / timedelta(milliseconds=1))
        if width_ms < 1000:
            raise BadInput(f"bucket width {width} is below one second")
        aligned = window.aligned(width)
        start_ms, end_ms = _ms(aligned.start), _ms(aligned.end)
        client = self.client
        q0, w0 = client.queries, len(client.warnings)
        report = SourceReport()
        stats = ReadStats()
        major = self._server_major(stats)
        rng = promql.range_ms(width_ms, major)

        names = self._present_names(start_ms, end_ms)
        stats.names = names
        first_end = start_ms + width_ms
        series = self._read_aggregates(names, first_end, end_ms, width_ms, rng)
        # the naming decides the unit of DCGM_FI_DEV_GPU_UTIL_RATIO (percent in DCGM 4.6, a
        # ratio in dcgm-exporter 4.9): told by the names, else by that name's values
        util = [v for s in series if s.name == UTIL_RATIO for a in ("min", "max") for v in s.aggs.get(a, ())]
        naming, stats.naming_why, unknown = detect_naming(names, util)
        stats.naming = naming
        if unknown:  # neither unit can be ruled out: reading it either way could invert a verdict
            series = [s for s in series if s.name != UTIL_RATIO]
            report.warnings.append(stats.naming_why)
        # A GPU exported by both the node agent and dcgm-exporter is counted once: the agent's
        # series win per (device, metric) (auditor/core/source_preference.py says why).
        series, shadowed = prefer_one_source(series, labels=lambda s: s.labels, metric=lambda s: s.metric)
        if shadowed:
            report.warnings.append(
                f"{len(shadowed)} dcgm-exporter series left out: the gpu-auditor node agent serves the same GPU and metric"
            )

        conv = self.forced or promql.detect_convention(s.labels for s in series)
        report.labels = conv.describe()
        report.labels.update(_device_labels(s.labels for s in series))
        report.labels["naming"] = naming.value

        #: (pod, GPU key, metric) → one list of time-ordered buckets per series (or re-read part)
        groups: dict[tuple[PodRef, str, Metric], list[BucketRun | list[Bucket]]] = {}
        n_ends = (end_ms - first_end) // width_ms + 1
        #: (start, end) of each bucket of the read, shared by all its buckets
        spans = [(_dt(first_end + i * width_ms - width_ms), _dt(first_end + i * width_ms)) for i in range(n_ends)]
        # One PodRef / GpuId object per pod / device (not per series): the summary and the
        # engine group buckets by these, and identical objects compare and hash by identity.
        pod_objs: dict[PodRef, PodRef] = {}
        gpu_objs: dict[GpuId, GpuId] = {}

        dirty: dict[str, list[tuple[_Series, PodRef, GpuId, list[int]]]] = {}
        #: samples per clean full bucket → how many buckets had that many (the interval estimate)
        counts: dict[int, int] = {}
        # 1. which pod and GPU each series describes (series order, for the warnings)
        attributed: list[tuple[_Series, PodRef, GpuId]] = []
        # one list, emptied as it goes: each series is dropped once handled, unless a re-read needs it
        pending = cast("list[_Series | None]", series)
        del series
        for k in range(len(pending)):
            s, pending[k] = pending[k], None
            assert s is not None  # each slot is taken once
            gpu = promql.gpu_of(s.labels)
            if gpu is None:
                report.warnings.append(f"{s.name} series without a GPU identity skipped: {_short(s.labels)}")
                continue
            gpu = gpu_objs.setdefault(gpu, gpu)
            stats.gpus.add(gpu.key)
            stats.mig = stats.mig or bool(gpu.instance)
            if gpu.hostname:
                stats.hosts.setdefault(gpu.hostname, set()).add(s.metric)
            if s.aggs:
                report.present.add(s.metric)
            pod = promql.pod_of(s.labels, conv)
            if pod is not None and promql.looks_like_exporter(s.labels, conv):
                stats.exporter_pods.add(f"{pod.namespace}/{pod.pod}")
                pod = None
            if pod is None:
                continue
            stats.attributed.add(gpu.key)
            attributed.append((s, pod_objs.setdefault(pod, pod), gpu))
        del pending
        # 2. clean and dirty buckets of every series, a whole exporter name at a time
        decided = _classify(
            [s for s, _, _ in attributed if "count" in s.aggs],
            n_ends,
            first_end,
            width_ms,
            counts,
            naming,
            last_open=aligned.end > window.end,
        )
        # 3. runs of clean buckets and the dirty buckets to re-read, in series order
        for s, pod, gpu in attributed:
            cnts = s.aggs.get("count")
            if cnts is None:  # an incomplete answer: no counts, so re-read whatever it has raw
                seen = {i for a in s.aggs.values() for i, v in enumerate(a) if v == v}
                dirty.setdefault(s.name, []).append((s, pod, gpu, [first_end + i * width_ms for i in sorted(seen)]))
                continue
            idx, bad = decided[id(s)]
            if idx:
                # the buckets stay as the series' arrays until a caller needs them as objects
                sums, mins, maxs = (s.aggs.get(a) or _nans(len(cnts)) for a in ("sum", "min", "max"))
                groups.setdefault((pod, gpu.key, s.metric), []).append(
                    BucketRun(pod, gpu, s.metric, scale_of(s.name, naming), spans, sums, cnts, mins, maxs, idx)
                )
            if bad:
                dirty.setdefault(s.name, []).append((s, pod, gpu, bad))
        del attributed, decided

        for name, items in sorted(dirty.items()):
            for b in self._reread_garbage(name, items, width_ms, major, naming):
                if b.dropped:
                    report.dropped[b.metric] = report.dropped.get(b.metric, 0) + b.dropped
                groups.setdefault((b.pod, b.gpu.key, b.metric), []).append([b])

        unattributed = stats.gpus - stats.attributed
        if unattributed:
            report.warnings.append(
                f"{len(unattributed)} of {len(stats.gpus)} GPUs had no workload pod label in the window "
                "(not in use, or not attributed): not audited as jobs"
            )
        if stats.exporter_pods:
            report.warnings.append(
                "series whose pod label names dcgm-exporter itself were not treated as jobs "
                f"({', '.join(sorted(stats.exporter_pods))}); if workloads run there, scrape with honorLabels: true"
            )
        if conv.pod == "exported_pod" and not self.forced:
            report.warnings.append(
                "dcgm-exporter is scraped with honorLabels: false (workload pods are in exported_pod); read them from there"
            )
        # an operator cycle's window is often one or two buckets, none of them full: it reports
        # what the last window with full buckets measured, never an estimate from partial ones
        measured = _interval(counts, width_ms)
        if measured is not None:
            self._interval = measured
        report.scrape_interval = measured or self._interval
        report.queries = client.queries - q0
        report.warnings.extend(client.warnings[w0:])
        self.stats = stats
        return SourceResult(buckets=LazyBuckets(_merge(groups, report)), report=report)  # type: ignore[arg-type]

    # -- steps -------------------------------------------------------------------------------------
    def _server_major(self, stats: ReadStats) -> int:
        """Prometheus's major version (range-selector boundary semantics changed in 3.0)."""
        info = self.client.buildinfo() if self._major is None else {"version": self.stats.version}
        version = str(info.get("version", "") or "")
        stats.version = version
        if self._major is None:
            m = re.match(r"v?(\d+)\.", version)
            self._major = int(m.group(1)) if m else 2
            if not m:
                log.info("Prometheus at %s reports no version; assuming 2.x range-selector semantics", self.url)
        return self._major

    def _present_names(self, start_ms: int, end_ms: int) -> list[str]:
        known = [n for m in self.metrics for n in SPECS[m].names]
        match = promql.selector("", self.matchers, {"__name__": promql.regex_alternation(known)})
        found = self.client.label_values("__name__", [match], start_ms, end_ms)
        return sorted(n for n in found if n in set(known))

    def _read_aggregates(
        self, names: list[str], first_end: int, last_end: int, width_ms: int, rng: int
    ) -> list[_Series]:
        """Run the bucket queries (concurrently) and fold each answer in as it arrives.

        At most ``concurrency`` queries are in flight, and each worker turns its decoded answer
        into flat arrays of values (NaN = no sample) before handing it over, so peak memory
        is a few answers plus the arrays, not every decoded answer at once.
        """
        jobs = [
            (name, agg, a, b)
            for name in names
            for agg in promql.AGGREGATES
            for a, b in promql.chunks(first_end, last_end, width_ms, self.max_points - 1)
        ]
        n = (last_end - first_end) // width_ms + 1
        #: (name, sorted label items) → series: a sorted tuple is half the size of a frozenset
        by_key: dict[tuple[str, tuple[tuple[str, str], ...]], _Series] = {}
        index: dict[object, int] = {}
        #: (name, chunk) → the series of the first answer for it, in answer order. Prometheus
        #: answers every aggregate of one selector with the same series in the same order, so
        #: the other three answers find their series by position, checked by comparing the
        #: label dicts (cheap), and hash the label set only where that check fails.
        order: dict[tuple[str, int], list[_Series]] = {}
        strings: dict[str, str] = {}

        def compact(result: list[dict]) -> list[tuple[dict, int, Any]]:
            """An answer as (labels, first bucket index, values array) per series; the
            index is -1 (and the values (index, value) pairs) where the series has gaps."""
            out: list[tuple[dict, int, Any]] = []
            for item in result:
                labels = item.get("metric", {})
                labels.pop("__name__", None)
                points = item.get("values")
                if not points:
                    out.append((labels, 0, _EMPTY))
                    continue
                first = _index(index, points[0][0], first_end, width_ms)
                last = _index(index, points[-1][0], first_end, width_ms)
                if last - first + 1 == len(points):  # no gaps: one slice assignment
                    out.append((labels, first, array("d", [float(v) for _, v in points])))
                else:
                    out.append((labels, -1, [(_index(index, t, first_end, width_ms), float(v)) for t, v in points]))
            return out

        def fetch(name: str, agg: str, a: int, b: int) -> list[tuple[dict, int, Any]]:
            return self._range_chunk(name, agg, a, b, width_ms, rng, compact)

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            queue = iter(jobs)
            inflight: dict[Future, tuple[str, str, int]] = {}

            def submit_next() -> None:
                job = next(queue, None)
                if job is not None:
                    inflight[pool.submit(fetch, *job)] = job[:3]

            for _ in range(self.concurrency):
                submit_next()
            while inflight:
                done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                for future in done:
                    name, agg, chunk = inflight.pop(future)
                    submit_next()
                    metric = BY_NAME[name]
                    result = future.result()
                    ref = order.get((name, chunk))
                    mine: list[_Series] | None = None
                    if ref is None:
                        mine = order[(name, chunk)] = []
                        ref = []
                    n_ref = len(ref)
                    for j, (labels, first, got) in enumerate(result):
                        if j < n_ref and ref[j].labels == labels:
                            s = ref[j]
                        else:
                            key = (name, tuple(sorted(labels.items())))
                            found = by_key.get(key)
                            if found is None:
                                own = _own_labels(labels, strings)
                                found = by_key[(name, tuple(sorted(own.items())))] = _Series(name, metric, own)
                            s = found
                        if mine is not None:
                            mine.append(s)
                        values = s.aggs.get(agg)
                        if values is None:
                            values = s.aggs[agg] = _nans(n)
                        if first >= 0:
                            values[first : first + len(got)] = got
                        else:
                            for i, v in got:
                                values[i] = v
                    del result, future
        return list(by_key.values())

    def _range_chunk(
        self,
        name: str,
        agg: str,
        first_end: int,
        last_end: int,
        width_ms: int,
        rng: int,
        convert: Callable[[list[dict]], list] = list,
    ) -> list:
        """One query_range over bucket ends ``first_end..last_end``; halves itself on sample limits.

        Returns ``convert`` of the answer's series (run under the client's decode lock).
        """
        expr = promql.bucket_query(promql.selector(name, self.matchers), agg, rng)
        try:
            return self.client.query_range(
                expr,
                first_end - 1,
                last_end - 1,
                width_ms,
                convert=lambda data: convert((data or {}).get("result", [])),
            )
        except QueryRefused as exc:
            if not _TOO_MANY.search(str(exc)) or first_end == last_end:
                raise
            mid = first_end + ((last_end - first_end) // width_ms // 2) * width_ms
            log.info("splitting %s at %s: %s", expr, mid, exc)
            return self._range_chunk(name, agg, first_end, mid, width_ms, rng, convert) + self._range_chunk(
                name, agg, mid + width_ms, last_end, width_ms, rng, convert
            )

    def _reread_garbage(
        self,
        name: str,
        items: list[tuple[_Series, PodRef, GpuId, list[int]]],
        width_ms: int,
        major: int,
        naming: Naming = Naming.CLASSIC,
    ) -> list[Bucket]:
        """Raw samples of just the dirty series and buckets, aggregated here with garbage dropped."""
        metric = BY_NAME[name]
        scale = scale_of(name, naming)
        wanted: dict[frozenset, tuple[PodRef, GpuId, set[int]]] = {
            frozenset(s.labels.items()): (pod, gpu, set(ends)) for s, pod, gpu, ends in items
        }
        ends = sorted({e for _, _, _, es in items for e in es})
        # narrow the raw read to the dirty GPUs when they all name themselves the same way
        spellings = {"UUID" if s.labels.get("UUID") else "uuid" if s.labels.get("uuid") else "" for s, *_ in items}
        regex: dict[str, str] = {}
        if len(spellings) == 1 and "" not in spellings:
            label = spellings.pop()
            regex[label] = promql.regex_alternation(s.labels[label] for s, *_ in items)
        sel = promql.selector(name, self.matchers, regex)
        samples: dict[frozenset, list[tuple[int, float]]] = {}
        for first, last in _spans(ends, width_ms, RAW_SPAN_BUCKETS):
            span = last - first + width_ms
            rng = promql.range_ms(span, major)
            data = self.client.query(f"{sel}[{rng}ms]", at_ms=last - 1)
            for item in (data or {}).get("result", []):
                labels = dict(item.get("metric", {}))
                labels.pop("__name__", None)
                key = frozenset(labels.items())
                if key in wanted:
                    samples.setdefault(key, []).extend(
                        (promql.parse_ts_ms(t), float(v)) for t, v in item.get("values", [])
                    )
        out: list[Bucket] = []
        for key, (pod, gpu, bucket_ends) in wanted.items():
            per_bucket: dict[int, list[float]] = {e: [] for e in bucket_ends}
            for ts, v in samples.get(key, []):
                end = ts - ts % width_ms + width_ms
                if end in per_bucket:
                    per_bucket[end].append(v)
            for end, values in sorted(per_bucket.items()):
                out.append(_aggregate(pod, gpu, metric, _dt(end - width_ms), _dt(end), values, scale))
        return out


def _index(cache: dict, ts: float, first_end: int, width_ms: int) -> int:
    """Bucket index of an evaluation timestamp (``end - 1ms``) in the read's bucket grid."""
    i = cache.get(ts)
    if i is None:
        i = cache[ts] = (promql.parse_ts_ms(ts) + 1 - first_end) // width_ms
    return i


def _spans(ends: list[int], width_ms: int, max_buckets: int) -> list[tuple[int, int]]:
    """Cover sorted bucket ends with runs of at most ``max_buckets`` buckets (first, last end)."""
    out: list[tuple[int, int]] = []
    for e in ends:
        if out and e - out[-1][0] < max_buckets * width_ms:
            out[-1] = (out[-1][0], e)
        else:
            out.append((e, e))
    return out


def _aggregate(
    pod: PodRef,
    gpu: GpuId,
    metric: Metric,
    start: datetime,
    end: datetime,
    raw: list[float],
    scale: float | None = None,
) -> Bucket:
    """One bucket from raw samples through the core's rollup (garbage dropped and counted there)."""
    width = end - start
    t0 = start.timestamp()
    rolled = aggregate((Sample(pod, gpu, metric, t0, r, scale) for r in raw), width)
    if not rolled:
        return Bucket(pod, gpu, metric, start, end, 0.0, 0, 0.0, 0.0, 0)
    return rolled[0]


def _classify(
    series: list[_Series],
    n: int,
    first_end: int,
    width_ms: int,
    counts: dict[int, int],
    naming: Naming = Naming.CLASSIC,
    *,
    last_open: bool = False,
) -> dict[int, tuple[Sequence[int] | None, list[int] | None]]:
    """Per series (by ``id``): the positions of its clean buckets and the ends of its dirty ones.

    A bucket is dirty when its sum is NaN or infinite (a NaN sample), an aggregate is missing,
    or min/max fall outside the metric's valid range (garbage, or an overshoot that must be
    clamped): it is re-read raw. (NaN compares false, so NaN min/max are dirty too.) Done with
    numpy over all series of one exporter name at once, so the cost per bucket is a few
    machine instructions; the sample count of each clean full bucket goes into ``counts``: one
    with samples in both neighbours (outside the read, a neighbour is taken as present), except
    a last bucket the window's end cuts (``last_open``: its samples stop at the window's end).
    """
    import numpy as np  # only here: imported once per read, not at CLI start

    out: dict[int, tuple[Sequence[int] | None, list[int] | None]] = {}
    by_name: dict[str, list[_Series]] = {}
    for s in series:
        by_name.setdefault(s.name, []).append(s)
    whole = range(n)
    nan_row = _nans(n)
    histogram: dict[int, int] = {}
    for name, rows in by_name.items():
        spec = SPECS[BY_NAME[name]]
        scale = scale_of(name, naming)

        def stack(agg: str, rows: list[Any] = rows) -> Any:
            return np.frombuffer(b"".join(s.aggs.get(agg) or nan_row for s in rows), dtype=np.float64).reshape(
                len(rows), n
            )

        cnt = stack("count")
        present = cnt == cnt
        with np.errstate(invalid="ignore"):
            ok = present & np.isfinite(stack("sum"))
            ok &= stack("min") * scale >= spec.low
            ok &= stack("max") * scale <= spec.high
        bad = present & ~ok
        full, any_ok, any_bad = ok.all(axis=1).tolist(), ok.any(axis=1).tolist(), bad.any(axis=1).tolist()
        # only full buckets tell the scrape interval: a series that starts, ends or pauses inside
        # a bucket has fewer samples there, and so has the bucket the window's end cuts
        left = np.ones_like(present)
        left[:, 1:] = present[:, :-1]
        right = np.full_like(present, not last_open)
        right[:, :-1] = present[:, 1:]
        full_ok = ok & left & right
        values, times = np.unique(cnt[full_ok].astype(np.int64), return_counts=True)
        for v, t in zip(values.tolist(), times.tolist()):
            histogram[v] = histogram.get(v, 0) + t
        for j, s in enumerate(rows):
            idx: Sequence[int] | None = None
            if full[j]:
                idx = whole
            elif any_ok[j]:
                clean = np.flatnonzero(ok[j]).tolist()
                idx = range(clean[0], clean[-1] + 1) if clean[-1] - clean[0] + 1 == len(clean) else clean
            ends = [first_end + i * width_ms for i in np.flatnonzero(bad[j]).tolist()] if any_bad[j] else None
            out[id(s)] = (idx, ends)
    for v, t in histogram.items():
        counts[v] = counts.get(v, 0) + t
    return out


def _own_labels(labels: dict[str, str], strings: dict[str, str]) -> dict[str, str]:
    """A copy of a decoded label set whose values are fresh strings shared by all series.

    The series' labels outlive the decoded answer they came in; kept as they are, these few
    small objects would pin the memory of the whole answer (millions of freed points) in the
    allocator. Copies are made once per distinct value (the 9 metrics of a GPU share them).
    """
    out: dict[str, str] = {}
    for k, v in labels.items():
        c = strings.get(v)
        if c is None:
            c = v.encode().decode()
            strings[c] = c
        out[k] = c
    return out


def _nans(n: int) -> array:
    return array("d", _NANS[:n] if n <= len(_NANS) else [math.nan] * n)


def _merge(
    groups: dict[tuple[PodRef, str, Metric], list[BucketRun | list[Bucket]]], report: SourceReport
) -> list[Piece]:
    """All buckets, sorted by (pod, GPU, metric, start), one per (pod, GPU, metric, start), as
    pieces of a :class:`~auditor.core.rollup.LazyBuckets` (one per (pod, GPU, metric)).

    Where two series give the same pod, GPU, metric and bucket (HA Prometheus pairs, two scrape
    jobs on one exporter, a classic → ``_RATIO`` rename mid-bucket) the fuller bucket is kept:
    adding them would double-count samples.
    """
    out: list[Piece] = []
    duplicates = False
    order = sorted(groups, key=lambda k: (k[0].namespace, k[0].pod, k[0].container, k[1], k[2].value))
    for key in order:
        parts = groups[key]
        if len(parts) == 1:
            out.append((key[0], key[1], parts[0]))
            continue
        best: dict[datetime, Bucket] = {}
        for part in parts:
            for b in part.buckets() if isinstance(part, BucketRun) else part:
                old = best.get(b.start)
                if old is None:
                    best[b.start] = b
                    continue
                duplicates = True
                if (b.count, b.dropped) > (old.count, old.dropped):
                    best[b.start] = b
        out.append((key[0], key[1], [best[t] for t in sorted(best)]))
    if duplicates:
        report.warnings.append(
            "duplicate series for the same pod, GPU and metric (HA replicas or two scrape jobs?): kept the fuller one"
        )
    return out


def _interval(counts: Mapping[int, int], width_ms: int) -> float | None:
    """Scrape-interval estimate (:func:`~auditor.core.accumulate.interval_of`) from ``counts``:
    samples per full bucket → the number of buckets with that many (a histogram, so that
    millions of buckets need no sorted list). None when the window held no full bucket."""
    return interval_of((width_ms / 1000 / c, k) for c, k in counts.items() if c > 0)


def _device_labels(label_sets: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """Which spelling of the host and UUID labels the series use."""
    out: dict[str, str] = {}
    for labels in label_sets:
        for key, names in (("hostname", ("Hostname", "hostname")), ("uuid", ("UUID", "uuid"))):
            if key not in out:
                name, _ = promql.first_label(labels, *names)
                if name:
                    out[key] = name
        if "mig" not in out and labels.get("GPU_I_ID"):
            out["mig"] = "GPU_I_ID"
        if len(out) == 3:
            break
    return out


def _short(labels: Mapping[str, str]) -> str:
    keys = ("Hostname", "hostname", "instance", "gpu", "pod", "exported_pod")
    return ",".join(f"{k}={labels[k]}" for k in keys if k in labels) or "(no identifying labels)"
