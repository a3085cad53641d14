"""The operator process: settings → adapters → leader election → apscheduler cycles → shutdown.

Only the leader runs cycles; a standby keeps its informers warm and answers ``/readyz``, so
a takeover costs one lease duration at most (less after a clean shutdown: the Lease is released).
``run_once`` takes the Lease too (waiting up to one lease duration), so ``run --once`` never
races a running operator; ``leader_election.enabled: false`` (``--no-leader-election``) runs
without one. A dry run (``dry_run``) takes no Lease and writes nothing to the cluster: its API
client refuses every write, policies record would-do decisions, weekly reports are not sent.

Every "now" comes from :attr:`Operator.clock`, so tests can put a cycle at any time.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from apscheduler.schedulers.background import BackgroundScheduler

from auditor.clock import SYSTEM_CLOCK, NowOnly
from auditor.errors import AuditorError, BadInput, LeaseUnavailable, SourceUnavailable
from auditor.operator_loop.cycle import ORIGIN, ClusterJobs, CycleResult, CycleRunner, LostLeadership
from auditor.operator_loop.health import HealthServer, OperatorMetrics
from auditor.operator_loop.policies import PolicyStage
from auditor.operator_loop.reports import ReportStage
from auditor.operator_loop.retention import RetentionStage
from auditor.operator_loop.shards import ShardResolver, ShardSource
from auditor.ports import Clock, LeaderElection
from auditor.settings import Settings

log = logging.getLogger(__name__)


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"


class Operator:
    """One operator replica. Build it (:func:`auditor.compose.operator`), then :meth:`run_forever`
    or :meth:`run_once`.

    The adapters not given are built by the composition root (:mod:`auditor.compose`) from
    ``settings``. ``clock`` (a :class:`~auditor.ports.Clock`, or a function returning "now")
    gives every "now" of the loop (cycle ends, policy decisions, report schedule, the Lease's
    times); ``dry_run`` decides without acting on anything (see the module docstring).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        store: Any = None,
        source: Any = None,
        api: Any = None,
        identity: str | None = None,
        clock: Clock | Callable[[], datetime] = SYSTEM_CLOCK,
        dry_run: bool = False,
    ) -> None:
        from auditor import compose

        self.settings = settings
        #: the loop's clock; :attr:`clock` is its ``now`` (what the stages and the scheduler call)
        self.time: Clock = clock if isinstance(clock, Clock) else NowOnly(clock)
        self.clock: Callable[[], datetime] = self.time.now
        self.dry_run = dry_run
        self.metrics = OperatorMetrics()
        self.identity = settings.leader_election.identity or identity or default_identity()
        if api is None:
            api = compose.kube_api(settings, dry_run=dry_run)
        elif dry_run:
            compose.read_only(api)
        self.api = api
        self.store = store or compose.store(settings)
        self.source = source or compose.prometheus_source(settings)
        #: the informers' owner: started, synced and stopped with the replica
        self.kube = compose.kube_resolver(settings, self.api)
        #: the job view the cycles read: the whole cluster's, or this shard's part of it
        self.resolver: ClusterJobs = self.kube
        try:
            #: this operator's share of the cluster (docs/scale.md, "Shards"); the whole one by default
            self.shard = settings.sharding.resolve(os.environ.get("POD_NAME") or self.identity)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        if self.shard.sharded:
            mine = ShardResolver(self.kube, self.shard)
            conv = settings.prometheus.label_convention
            label = {"exported_pod": "exported_namespace", "pod_name": "pod_namespace"}.get(conv, "namespace")
            self.source = ShardSource(self.source, mine, label=label)
            self.resolver = mine
        le = settings.leader_election
        self.elector: LeaderElection | None = None
        #: why the elector gave up (e.g. the Lease's namespace is missing): ``run_forever`` raises it
        self.fatal: LeaseUnavailable | None = None
        if le.enabled and not dry_run:
            self.elector = compose.lease_elector(
                settings,
                self.api,
                identity=self.identity,
                clock=self.time,
                on_started=self._on_started,
                on_stopped=self._on_stopped,
                on_fatal=self._on_fatal,
                lease_name=f"{le.lease_name}-shard-{self.shard.index}" if self.shard.sharded else None,
            )
        self.runner = CycleRunner(
            store=self.store,
            source=self.source,
            resolver=self.resolver,
            cluster=settings.cluster,
            width=settings.bucket_width,
            max_lookback=settings.max_lookback,
            catch_up_chunk=settings.catch_up_chunk,
            holder=self.identity,
            still_leader=self.is_leader,
            dry_run=dry_run,
            thresholds=settings.thresholds,
            clock=self.time,
            shard=self.shard,
            mfu=compose.mfu_plan(settings),
        )
        #: the efficiency gate's AdmissionCheck controller (``gate.enabled``), run while leading
        # once per cluster, by the first shard: the weekly reports, retention and the gate
        self.gate = self._gate_stage() if settings.gate.enabled and not dry_run and self.shard.primary else None
        self.policies = (
            PolicyStage(
                settings,
                self.store,
                compose.kube_actions(self.api, instance=self.identity),
                dry_run=dry_run,
                # the ladder's requeue goes through the gate's check where that helps (issue 16 item 6)
                check_requeue=compose.check_requeue(self.gate) if self.gate is not None else None,
            )
            if (settings.policies.builtin or settings.policies.dir)
            else None
        )
        self.reports = ReportStage(settings, self.store, compose.report_destinations(settings))
        self.retention = RetentionStage(settings, self.store)
        self.metrics.fleet.snapshot.held = self._held_jobs
        self.scheduler: BackgroundScheduler | None = None
        self.health: HealthServer | None = None
        self._stop = threading.Event()
        self._cycle_lock = threading.Lock()
        self._delivery_lock = threading.Lock()
        self._reports_due = threading.Event()
        #: what the last delivery pass did with the queued alerts (None before the first)
        self.last_delivery: Any = None
        self._started = False
        self._cycle_began: float | None = None
        self.cycles_run = 0

    # ------------------------------------------------------------------ state

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def _healthy(self) -> tuple[bool, str]:
        if self.scheduler is not None and not self.scheduler.running and not self._stop.is_set():
            return False, "scheduler stopped"
        began = self._cycle_began
        limit = 3 * self.settings.interval.total_seconds() + 600
        if began is not None and self.time.monotonic() - began > limit:
            return False, f"cycle running for more than {limit:.0f} s"
        return True, "ok"

    def _ready(self) -> tuple[bool, str]:
        if not self._started:
            return False, "starting"
        if not self.kube.synced:
            return False, "informers not synced"
        return True, "leader" if self.is_leader() else "standby"

    def _console_mounts(self) -> dict[str, Any]:
        """The web console under ``/console`` (docs/console.md) unless ``console.enabled`` is off."""
        from auditor import compose

        if not self.settings.console.enabled:
            return {}
        app = compose.console(self.settings, self.store, self.clock, writes=self.settings.console.writes)
        log.info("serving the web console under /console/ (%s)", "writes enabled" if app.config.writes else "read-only")
        return {app.config.base: app.mount}

    def _ack_routes(self) -> dict[str, Any]:
        """``/gate/ack`` (signed acknowledgement links) when ``gate.ack_link_key_file`` is set."""
        from auditor.errors import BadInput
        from auditor.operator_loop.ack_endpoint import PATH, AckEndpoint, read_link_key, without_key
        from auditor.store.lineage import AckLog

        if not self.settings.gate.ack_link_key_file:
            return {}
        try:
            key = read_link_key(self.settings.gate.ack_link_key_file)
        except BadInput as exc:  # an optional feature: the operator runs on without it
            log.error("signed acknowledgement links are off: %s", exc)
            return {PATH: without_key(str(exc))}
        endpoint = AckEndpoint(
            AckLog(self.store),
            key,
            cluster=self.settings.cluster,
            clock=self.clock,
            snoozes=self.store.job_snoozes(),  # issue 30: the alert's snooze link, same path
        )
        return {PATH: endpoint.handle}

    def _gate_stage(self) -> Any:
        from auditor.gate.stage import GateRules, GateStage
        from auditor.operator_loop.policies import policy_files

        # the gate rules (kind GatePolicy) of the operator's policy files, re-read every sweep
        # interval while leading; a bad file keeps its last good rules, like the cycle's policies
        rules = GateRules(lambda: policy_files(self.settings))
        rules.refresh()
        names = ", ".join(r.name for r in rules.rules) or "none"
        log.info("efficiency gate: %d rule(s): %s", len(rules.rules), names)
        return GateStage(
            self.settings,
            self.api,
            self.store,
            rules,
            clock=self.clock,
            instance=self.identity,
            registry=self.metrics.registry,
        )

    def _start_gate(self) -> None:
        if self.gate is not None and not self._stop.is_set():
            # its informers sync in their own time; the elector's thread must not wait for them
            threading.Thread(target=self.gate.start, name="gate-start", daemon=True).start()

    def _on_started(self) -> None:
        self.metrics.leader.set(1)
        self._start_gate()
        if self.scheduler is not None and not self._stop.is_set():
            try:  # audit right away instead of waiting for the next interval
                self.scheduler.modify_job("cycle", next_run_time=self.clock())
            except Exception:  # noqa: BLE001 - the job may be gone during shutdown
                pass

    def _on_stopped(self) -> None:
        self.metrics.leader.set(0)
        if self.gate is not None:
            # it stops answering at once; its threads finish in their own time, not the elector's
            threading.Thread(target=self.gate.stop, name="gate-stop", daemon=True).start()

    def _on_fatal(self, exc: LeaseUnavailable) -> None:
        self.fatal = exc
        self._stop.set()

    # ------------------------------------------------------------------ start / stop

    def _log_kueue(self) -> None:
        """Which Kueue runs and whether the gates the chosen options rest on are on, once at start
        (issue 29): demotion and hold-before-quota need alpha/beta Kueue gates a stock install may
        leave off, and nothing else would say so. Never stops the start."""
        if not self.settings.features.kueue:
            return
        from auditor import compose

        try:
            for line in compose.kueue_findings(self.settings, self.api):
                (log.warning if line.level == "warn" else log.info)("%s: %s", line.subject, line.text)
        except Exception as exc:  # noqa: BLE001 - a report only; the operator runs without it
            log.info("Kueue version and feature gates not read: %s", exc)

    def start(self, *, http: bool = True, sync_timeout: float = 120.0) -> None:
        from auditor.settings import log_effective

        log_effective(self.settings)
        self._log_kueue()
        if http:
            self.health = HealthServer(
                self.settings.http.host,
                self.settings.http.port,
                metrics=self.metrics,
                healthy=self._healthy,
                ready=self._ready,
                routes=self._ack_routes(),
                mounts=self._console_mounts(),
            ).start()
            log.info("serving /healthz, /readyz, /metrics on port %d", self.health.port)
        self.kube.start()
        if not self.kube.wait_synced(sync_timeout):
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
        if self.gate is not None:
            self.gate.close()
        self.kube.stop()
        if self.health is not None:
            self.health.stop()
        try:
            self.source.close()
        except Exception:  # noqa: BLE001
            pass
        self.store.close()

    def _held_jobs(self) -> int | None:
        """The gate's held Jobs now (its controller's cache), None while no gate answers."""
        ctl = self.gate.controller if self.gate is not None else None
        return len(ctl.held_jobs()) if ctl is not None else None

    # ------------------------------------------------------------------ cycles

    def cycle(self) -> CycleResult | None:
        """One cycle if this replica leads (the scheduled job); None when it does not."""
        if not self.is_leader():
            self.metrics.cycles.labels("standby").inc()
            return None
        with self._cycle_lock:
            self._cycle_began = self.time.monotonic()
            try:
                with self.metrics.cycle_seconds.time():
                    result = self.runner.run(self.clock())
            except LostLeadership as exc:
                log.warning("%s", exc)
                self.metrics.cycles.labels("lost_lease").inc()
                return None
            except Exception as exc:
                stage = "prometheus" if isinstance(exc, SourceUnavailable) else type(exc).__name__
                self.metrics.errors.labels(stage).inc()
                self.metrics.cycles.labels("failed").inc()
                self.metrics.last_cycle.set(self.clock().timestamp())
                log.error("cycle failed: %s", exc, exc_info=not isinstance(exc, AuditorError))
                self._record_failure(exc)
                raise
            finally:
                self._cycle_began = None
                self.metrics.kube_requests.set(self.kube.api_requests)
        if self.policies is not None:
            result.decisions = self.policies.run(result.summaries, now=self.clock())
        # alerts and weekly reports go out from the delivery job (:meth:`deliver`), never here:
        # a slow receiver must not hold up the next audit
        self._reports_due.set()
        self.cycles_run += 1
        m = self.metrics
        m.cycles.labels("ok").inc()
        m.jobs_audited.set(len(result.summaries))
        m.summaries.inc(len(result.summaries))
        m.final_summaries.inc(len(result.finalized))
        m.gpu_jobs.set(result.jobs_seen)
        m.prometheus_queries.inc(result.queries)
        m.count_undelivered(result.decisions)
        m.count_rejected(result.rejected)
        m.fleet.observe_cycle(self.settings.cluster, result.window, result.summaries, result.decisions)
        m.fleet.observe_store(self.store, self.settings.cluster, self.clock(), since=self.clock() - timedelta(days=7))
        m.window_seconds.set(result.window.seconds if result.window else 0)
        finished = self.clock().timestamp()
        m.last_cycle.set(finished)
        m.last_success.set(finished)
        log.info(
            "cycle done in %.1f s: %d summaries, %d final, %d queries",
            result.seconds,
            len(result.summaries),
            len(result.finalized),
            result.queries,
        )
        return result

    def _record_failure(self, exc: Exception) -> None:
        try:
            now = self.clock()
            w = self.runner.plan(now, {})
            self.store.record_run(
                w,
                now,
                now,
                jobs=0,
                queries=0,
                status="failed",
                detail={
                    "origin": ORIGIN,
                    "cluster": self.settings.cluster,
                    "holder": self.identity,
                    "error": f"{type(exc).__name__}: {exc}",
                    **({"dry_run": True} if self.dry_run else {}),
                },
            )
        except Exception:
            log.debug("could not record the failed cycle", exc_info=True)

    def prune(self) -> Any:
        """Apply ``store.retention`` to this cluster's rows (the hourly job): the leader only,
        never during a cycle, never in a dry run (it writes nothing it was not asked to).
        Returns the :class:`~auditor.store.retention.PruneResult`, or None when it did not run."""
        if self.dry_run or not self.is_leader():
            return None
        with self._cycle_lock:
            return self.retention.run(self.clock())

    def deliver(self, *, budget: float | None = None) -> Any:
        """One pass of the deliveries (the leader's, never in a dry run): the queued alerts that
        are due, then the weekly reports that are due. It runs beside the cycles, under a lock
        of its own, so a hung receiver delays no audit. Returns the alerts' DrainResult (None
        when it did not run); :attr:`last_delivery` keeps it."""
        if self.dry_run or not self.is_leader():
            return None
        if budget is None:
            budget = self.settings.notifications.deadline.total_seconds()
        with self._delivery_lock:
            result = self.policies.deliver(self.clock(), budget=budget) if self.policies is not None else None
            if self._reports_due.is_set():  # once after each cycle (the cron job sends on time too)
                self._reports_due.clear()
                self.reports.send(now=self.clock())
        self.last_delivery = result
        return result

    def _scheduled_delivery(self) -> None:
        try:
            self.deliver()
        except Exception:  # the next pass tries again
            log.exception("delivery pass failed")

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
            self._scheduled,
            "interval",
            seconds=self.settings.interval.total_seconds(),
            id="cycle",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            next_run_time=self.clock() if self.elector is None else None,
        )
        if not self.dry_run:
            self.scheduler.add_job(
                self._scheduled_delivery,
                "interval",
                seconds=self.settings.notifications.delivery_interval.total_seconds(),
                id="deliveries",
                max_instances=1,
                coalesce=True,
            )
            if self.shard.primary:
                self.reports.schedule(self.scheduler, self.is_leader, self.clock)
                self.retention.schedule(self.scheduler, self.prune, start=self.clock())
        self.scheduler.start()
        if self.elector is not None:
            self.elector.start()
        else:
            self._start_gate()
        try:
            self._stop.wait()
        finally:
            self.shutdown()
        if self.fatal is not None:
            raise self.fatal

    def request_stop(self) -> None:
        self._stop.set()

    def run_once(self) -> CycleResult:
        """Take the Lease (waiting up to one lease duration), run one cycle, release, stop.

        Raises :class:`LeaseUnavailable` at once when waiting cannot help (its namespace is
        missing: exit 2), and names a holder only when one was read from the Lease.
        """
        self.start(http=False)
        try:
            if self.elector is not None:
                el = self.elector
                le = self.settings.leader_election
                wait = le.lease_duration.total_seconds() + 2 * le.retry_period.total_seconds()
                if not el.acquire(timeout=wait):
                    holder = el.holder()
                    if holder:
                        raise AuditorError(
                            f"another operator ({holder}) holds the Lease {el.namespace}/{el.name}; not auditing "
                            "(the running operator does; --dry-run tries a cycle without the Lease)"
                        )
                    raise AuditorError(
                        f"could not take the Lease {el.namespace}/{el.name} in {wait:.0f} s: "
                        f"{el.last_error or 'no answer'}"
                    )
                el.start()  # keep renewing while the cycle runs
            result = self.cycle()
            if result is None:
                raise AuditorError("lost the Lease before the cycle could run")
            self.deliver()  # the cycle's alerts (what fails to go out stays queued for the operator)
            return result
        finally:
            self.shutdown()
