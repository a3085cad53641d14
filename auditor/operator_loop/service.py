"""The operator process: settings → adapters → leader election → apscheduler cycles → shutdown.

Only the leader runs cycles; a standby keeps its informers warm and answers ``/readyz``, so
a takeover costs one lease duration at most (less after a clean shutdown: the Lease is released).
``run_once`` takes the Lease too (waiting up to one lease duration), so ``run --once`` never
races a running operator.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from auditor.errors import AuditorError, SourceUnavailable
from auditor.kube.client import KubeConfig, api_client
from auditor.kube.lease import LeaderElector
from auditor.kube.resolver import KubeResolver
from auditor.operator_loop.cycle import ORIGIN, CycleResult, CycleRunner, LostLeadership
from auditor.operator_loop.health import HealthServer, OperatorMetrics
from auditor.operator_loop.policies import PolicyStage
from auditor.operator_loop.reports import ReportStage
from auditor.settings import Settings

log = logging.getLogger(__name__)


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"


def build_source(settings: Settings, token: str | None = None):  # -> PrometheusSource
    """The Prometheus source the settings describe (secrets from the variables they name)."""
    from auditor.errors import BadInput
    from auditor.sources.prometheus import PrometheusSource

    p = settings.prometheus
    if not p.url:
        raise BadInput("prometheus.url is not set (settings file, GPU_AUDITOR_PROMETHEUS_URL or --prometheus)")
    token = token or settings.secret(p.bearer_token_env, "prometheus.bearer_token_env")
    basic = None
    if p.username_env:
        user = settings.secret(p.username_env, "prometheus.username_env") or ""
        basic = (user, settings.secret(p.password_env, "prometheus.password_env") or "")
    return PrometheusSource(
        p.url,
        bearer_token=token,
        basic_auth=basic,
        ca_file=p.ca_file,
        insecure=not p.tls_verify,
        timeout=p.timeout.total_seconds(),
        retries=p.retries,
        matchers=p.matchers,
        pod_labels=None if p.label_convention == "auto" else p.label_convention,
    )


class Operator:
    """One operator replica. Build it, then :meth:`run_forever` or :meth:`run_once`."""

    def __init__(self, settings: Settings, *, store: Any = None, source: Any = None, api: Any = None,
                 identity: str | None = None) -> None:
        from auditor.store import Store

        self.settings = settings
        self.metrics = OperatorMetrics()
        self.identity = settings.leader_election.identity or identity or default_identity()
        self.api = api or api_client(KubeConfig(
            kubeconfig=settings.kubernetes.kubeconfig, in_cluster=settings.kubernetes.in_cluster,
            context=settings.kubernetes.context, impersonate=settings.kubernetes.impersonate,
        ))
        self.store = store or Store.open(settings.database_url())
        self.source = source or build_source(settings)
        self.resolver = KubeResolver(
            self.api, cluster=settings.cluster, team_sources=settings.team_sources,
            kueue=settings.features.kueue, unresolved_pods=settings.unresolved_pods,
            deleted_pod_memory=settings.deleted_pod_memory,
        )
        le = settings.leader_election
        self.elector: LeaderElector | None = None
        if le.enabled:
            self.elector = LeaderElector(
                self.api, namespace=le.namespace or os.environ.get("POD_NAMESPACE") or "gpu-auditor",
                name=le.lease_name, identity=self.identity, lease_duration=le.lease_duration,
                renew_deadline=le.renew_deadline, retry_period=le.retry_period,
                on_started=self._on_started, on_stopped=self._on_stopped,
            )
        self.runner = CycleRunner(
            store=self.store, source=self.source, resolver=self.resolver, cluster=settings.cluster,
            width=settings.bucket_width, max_lookback=settings.max_lookback,
            catch_up_chunk=settings.catch_up_chunk, holder=self.identity, still_leader=self.is_leader,
            thresholds=settings.thresholds,
        )
        self.policies = PolicyStage(settings, self.store, self.api, self.identity) if (
            settings.policies.builtin or settings.policies.dir) else None
        self.reports = ReportStage(settings, self.store)
        self.scheduler: BackgroundScheduler | None = None
        self.health: HealthServer | None = None
        self._stop = threading.Event()
        self._cycle_lock = threading.Lock()
        self._started = False
        self._cycle_began: float | None = None
        self.last_result: CycleResult | None = None
        self.cycles_run = 0

    # ------------------------------------------------------------------ state

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def _healthy(self) -> tuple[bool, str]:
        if self.scheduler is not None and not self.scheduler.running and not self._stop.is_set():
            return False, "scheduler stopped"
        began = self._cycle_began
        limit = 3 * self.settings.interval.total_seconds() + 600
        if began is not None and time.monotonic() - began > limit:
            return False, f"cycle running for more than {limit:.0f} s"
        return True, "ok"

    def _ready(self) -> tuple[bool, str]:
        if not self._started:
            return False, "starting"
        if not self.resolver.synced:
            return False, "informers not synced"
        return True, "leader" if self.is_leader() else "standby"

    def _on_started(self) -> None:
        self.metrics.leader.set(1)
        if self.scheduler is not None and not self._stop.is_set():
            try:  # audit right away instead of waiting for the next interval
                self.scheduler.modify_job("cycle", next_run_time=datetime.now(timezone.utc))
            except Exception:  # noqa: BLE001 - the job may be gone during shutdown
                pass

    def _on_stopped(self) -> None:
        self.metrics.leader.set(0)

    # ------------------------------------------------------------------ start / stop

    def start(self, *, http: bool = True, sync_timeout: float = 120.0) -> None:
        from auditor.settings import log_effective

        log_effective(self.settings)
        if http:
            self.health = HealthServer(self.settings.http.host, self.settings.http.port, metrics=self.metrics,
                                       healthy=self._healthy, ready=self._ready).start()
            log.info("serving /healthz, /readyz, /metrics on port %d", self.health.port)
        self.resolver.start()
        if not self.resolver.wait_synced(sync_timeout):
            log.warning("informers not synced after %.0f s; continuing", sync_timeout)
        self._started = True

    def shutdown(self) -> None:
        """Stop cycles (waiting for a running one), release the Lease, stop the informers."""
        self._stop.set()
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        if self.elector is not None:
            self.elector.stop(release=True)
        self.metrics.leader.set(0)
        self.resolver.stop()
        if self.health is not None:
            self.health.stop()
        try:
            self.source.close()
        except Exception:  # noqa: BLE001
            pass
        self.store.close()

    # ------------------------------------------------------------------ cycles

    def cycle(self) -> CycleResult | None:
        """One cycle if this replica leads (the scheduled job); None when it does not."""
        if not self.is_leader():
            self.metrics.cycles.labels("standby").inc()
            return None
        with self._cycle_lock:
            self._cycle_began = time.monotonic()
            try:
                with self.metrics.cycle_seconds.time():
                    result = self.runner.run()
            except LostLeadership as exc:
                log.warning("%s", exc)
                self.metrics.cycles.labels("lost_lease").inc()
                return None
            except Exception as exc:
                stage = "prometheus" if isinstance(exc, SourceUnavailable) else type(exc).__name__
                self.metrics.errors.labels(stage).inc()
                self.metrics.cycles.labels("failed").inc()
                self.metrics.last_cycle.set(time.time())
                log.error("cycle failed: %s", exc, exc_info=not isinstance(exc, AuditorError))
                self._record_failure(exc)
                raise
            finally:
                self._cycle_began = None
                self.metrics.kube_requests.set(self.resolver.api_requests)
        if self.policies is not None:
            result.decisions = self.policies.run(result.summaries, now=datetime.now(timezone.utc))
        self.reports.send()
        self.cycles_run += 1
        self.last_result = result
        m = self.metrics
        m.cycles.labels("ok").inc()
        m.jobs_audited.set(len(result.summaries))
        m.summaries.inc(len(result.summaries))
        m.final_summaries.inc(len(result.finalized))
        m.gpu_jobs.set(result.jobs_seen)
        m.prometheus_queries.inc(result.queries)
        m.count_undelivered(result.decisions)
        m.window_seconds.set(result.window.seconds if result.window else 0)
        m.last_cycle.set(time.time())
        m.last_success.set(time.time())
        log.info("cycle done in %.1f s: %d summaries, %d final, %d queries",
                 result.seconds, len(result.summaries), len(result.finalized), result.queries)
        return result

    def _record_failure(self, exc: Exception) -> None:
        try:
            now = datetime.now(timezone.utc)
            w = self.runner.plan(now, {})
            self.store.record_run(w, now, now, jobs=0, queries=0, status="failed",
                                  detail={"origin": ORIGIN, "cluster": self.settings.cluster,
                                          "holder": self.identity, "error": f"{type(exc).__name__}: {exc}"})
        except Exception:  # noqa: BLE001 - the cycle's own error matters more
            log.debug("could not record the failed cycle", exc_info=True)

    def _scheduled(self) -> None:
        try:
            self.cycle()
        except Exception:  # noqa: BLE001 - logged and counted in cycle(); the next interval retries
            pass

    def run_forever(self) -> None:
        """Until :meth:`request_stop` (SIGTERM/SIGINT in the CLI): lead or stand by, cycle, repeat."""
        self.start()
        self.scheduler = BackgroundScheduler(timezone=timezone.utc)
        self.scheduler.add_job(
            self._scheduled, "interval", seconds=self.settings.interval.total_seconds(), id="cycle",
            max_instances=1, coalesce=True, misfire_grace_time=None,
            next_run_time=datetime.now(timezone.utc) if self.elector is None else None,
        )
        self.reports.schedule(self.scheduler, self.is_leader)
        self.scheduler.start()
        if self.elector is not None:
            self.elector.start()
        try:
            self._stop.wait()
        finally:
            self.shutdown()

    def request_stop(self) -> None:
        self._stop.set()

    def run_once(self) -> CycleResult:
        """Take the Lease (waiting up to one lease duration), run one cycle, release, stop."""
        self.start(http=False)
        try:
            if self.elector is not None:
                wait = self.settings.leader_election.lease_duration.total_seconds() + 2 * self.settings.leader_election.retry_period.total_seconds()
                if not self.elector.acquire(timeout=wait):
                    holder = (self.elector._observed or ("?",))[0]
                    raise AuditorError(
                        f"another operator holds the Lease {self.elector.namespace}/{self.elector.name} "
                        f"({holder}); not auditing (the running operator does)"
                    )
                self.elector.start()  # keep renewing while the cycle runs
            result = self.cycle()
            if result is None:
                raise AuditorError("lost the Lease before the cycle could run")
            return result
        finally:
            self.shutdown()
