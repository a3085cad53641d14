"""``/healthz``, ``/readyz`` and ``/metrics`` on one small HTTP server (a thread).

``/healthz``: the process works (the scheduler runs, the last cycle did not hang past three
intervals). ``/readyz``: started — store open, informers synced — whether leader or standby (a
standby must be ready to take over quickly). ``/metrics``: prometheus-client's text format from
the operator's own registry; no per-job labels (a label per job would grow without bound).
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from auditor.core.identity import REASONS, Quarantine
from auditor.operator_loop.fleet_metrics import FleetMetrics

log = logging.getLogger(__name__)

#: a route served besides the three endpoints (e.g. ``/gate/ack``): (method, query, body) →
#: (status, content type, body)
Route = Callable[[str, str, bytes], tuple[int, str, bytes]]
#: an application mounted under a path prefix (e.g. the console under ``/console``): (method,
#: path below the prefix, query, request headers, body) → (status, content type, body, headers)
Mount = Callable[[str, str, str, Mapping[str, str], bytes], tuple[int, str, bytes, Mapping[str, str]]]
#: request bodies are forms of a few fields
MAX_BODY = 64 * 1024


class OperatorMetrics:
    """The operator's metrics, in their own registry (no process-global state)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.cycle_seconds = Histogram(
            "gpu_auditor_cycle_duration_seconds",
            "Wall time of one audit cycle",
            buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800),
            registry=r,
        )
        self.cycles = Counter("gpu_auditor_cycles", "Audit cycles by outcome", ["status"], registry=r)
        self.jobs_audited = Gauge("gpu_auditor_jobs_audited", "Jobs summarized by the last cycle", registry=r)
        self.summaries = Counter("gpu_auditor_job_summaries", "Job summaries written by cycles", registry=r)
        self.final_summaries = Counter("gpu_auditor_final_summaries", "Final summaries of ended jobs", registry=r)
        self.errors = Counter("gpu_auditor_errors", "Errors by stage", ["stage"], registry=r)
        self.leader = Gauge("gpu_auditor_leader", "1 while this replica holds the Lease", registry=r)
        self.gpu_jobs = Gauge("gpu_auditor_discovered_jobs", "GPU jobs in the cluster (last cycle)", registry=r)
        self.last_cycle = Gauge("gpu_auditor_last_cycle_timestamp_seconds", "End of the last cycle", registry=r)
        self.last_success = Gauge(
            "gpu_auditor_last_success_timestamp_seconds", "End of the last successful cycle", registry=r
        )
        self.prometheus_queries = Counter("gpu_auditor_prometheus_queries", "Prometheus queries made", registry=r)
        self.kube_requests = Gauge(
            "gpu_auditor_kube_api_requests", "Kubernetes API requests made since start", registry=r
        )
        self.window_seconds = Gauge("gpu_auditor_cycle_window_seconds", "Length of the last cycle's window", registry=r)
        self.alerts_undelivered = Counter(
            "gpu_auditor_policy_alerts_undelivered",
            "Policy alerts recorded as skipped, by team and reason (no_destination: no Slack or webhook route for the team)",
            ["team", "reason"],
            registry=r,
        )
        self.series_rejected = Counter(
            "gpu_auditor_series_rejected",
            "Series refused for a pod, namespace, container or owner name no Kubernetes object could have,"
            " by reason (never audited as a job; the log and doctor name them)",
            ["reason"],
            registry=r,
        )
        for reason in REASONS:  # each reason present from the start, at 0
            self.series_rejected.labels(reason=reason)
        #: per-team and cluster series (team, verdict, cluster: never a job or pod)
        self.fleet = FleetMetrics(r)

    def count_rejected(self, rejected: Quarantine) -> None:
        """A cycle's refused series (auditor/core/identity.py), per reason."""
        for reason, n in rejected.counts.items():
            self.series_rejected.labels(reason=reason).inc(n)

    def count_undelivered(self, decisions: Iterable[Any]) -> None:
        """Count the cycle's alerts that went nowhere (a team label: teams are few, unlike jobs)."""
        for d in decisions:
            result = d.results.get("notify")
            if isinstance(result, dict) and result.get("skipped") and result.get("reason"):
                self.alerts_undelivered.labels(team=result.get("team") or "", reason=result["reason"]).inc()


class HealthServer:
    """Serves the three endpoints; ``port=0`` picks a free port (see :attr:`port`)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        metrics: OperatorMetrics,
        healthy: Callable[[], tuple[bool, str]],
        ready: Callable[[], tuple[bool, str]],
        routes: Mapping[str, Route] | None = None,
        mounts: Mapping[str, Mount] | None = None,
    ) -> None:
        owner = self
        extra = dict(routes or {})
        mounted = dict(mounts or {})

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, ctype: str, body: bytes, headers: Mapping[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                if not headers or "Cache-Control" not in headers:
                    self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def _mounted(self, method: str, path: str, query: str, body: bytes | None) -> bool:
                """Serve ``path`` from the mount whose prefix it is under; False when none is."""
                for prefix, app in mounted.items():
                    if path == prefix or path.startswith(prefix + "/"):
                        sub = path[len(prefix) :] or "/"
                        self._reply(*app(method, sub, query, dict(self.headers.items()), body or b""))
                        return True
                return False

            def do_POST(self) -> None:
                path, _, query = self.path.partition("?")
                route = extra.get(path)
                length = int(self.headers.get("Content-Length") or 0)
                if length < 0 or length > MAX_BODY:
                    self._reply(413, "text/plain; charset=utf-8", b"request body too large\n")
                elif route is not None:
                    self._reply(*route("POST", query, self.rfile.read(length)))
                elif not any(path == p or path.startswith(p + "/") for p in mounted):
                    self._reply(404, "text/plain; charset=utf-8", b"not found\n")
                else:
                    self._mounted("POST", path, query, self.rfile.read(length))

            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                if path in extra:
                    self._reply(*extra[path]("GET", query, b""))
                    return
                if self._mounted("GET", path, query, b""):
                    return
                if path == "/metrics":
                    body, ctype, code = generate_latest(owner.metrics.registry), CONTENT_TYPE_LATEST, 200
                elif path in ("/healthz", "/readyz"):
                    ok, why = (healthy if path == "/healthz" else ready)()
                    body, ctype, code = (why or "ok").encode() + b"\n", "text/plain; charset=utf-8", 200 if ok else 503
                else:
                    body, ctype, code = b"not found\n", "text/plain; charset=utf-8", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug("http: " + fmt, *args)

        self.metrics = metrics
        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="health-http", daemon=True)

    def start(self) -> "HealthServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
