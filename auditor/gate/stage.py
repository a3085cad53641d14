"""The gate as the operator runs it: settings → use-case + controller, started on leadership.

Only the leader answers checks (two replicas writing check states would fight); a standby starts
the controller when it takes the Lease. The gate reads the store alone (a lineage's history and
acknowledgements), so a decision costs one indexed read.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any, Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram

from auditor.core.gate import GateMode, decide
from auditor.gate.admission import AdmissionGate, GateSettings
from auditor.gate.controller import ControllerConfig, Decided, GateController

log = logging.getLogger(__name__)


def core_decide(history: Any, rules: Any, mode: str, now: datetime) -> Any:
    """The core's ``decide`` behind the use-case's port (the mode as the core's enum)."""
    return decide(history, rules, GateMode(mode), now)


class GateMetrics:
    """Decision counts and latency, in the operator's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.seconds = Histogram(
            "gpu_auditor_gate_decision_seconds",
            "From the gate's watch seeing a Workload hold quota to its check state written",
            ["state"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.decisions = Counter(
            "gpu_auditor_gate_decisions",
            "Check states written, by state, what enforce would do, and whether a decision was made",
            ["state", "would", "decided"],
            registry=registry,
        )

    def observe(self, d: Decided) -> None:
        self.seconds.labels(d.state).observe(d.seconds)
        self.decisions.labels(d.state, d.would or "", "no" if d.failure else "yes").inc()


class GateStage:
    """Builds the gate from ``settings.gate`` and runs it while this replica leads."""

    def __init__(
        self,
        settings: Any,
        api: Any,
        store: Any,
        rules: Sequence[Any],
        *,
        clock: Callable[[], datetime],
        instance: str,
        registry: CollectorRegistry | None = None,
    ) -> None:
        from auditor.store.lineage import AckLog, LineageHistoryReader

        g = settings.gate
        self.gate = AdmissionGate(
            LineageHistoryReader(store),
            core_decide,
            list(rules),
            GateSettings(mode=g.mode, timeout=g.timeout.total_seconds(), fail_closed=g.fail_closed),
            acks=AckLog(store),
        )
        self.metrics = GateMetrics(registry) if registry is not None else None
        self.config = ControllerConfig(
            cluster=settings.cluster,
            holds_namespace=g.holds_namespace,
            holds_name=g.holds_name,
            sweep_interval=g.sweep_interval.total_seconds(),
        )
        self.api = api
        self.clock = clock
        self.instance = instance
        self.controller: GateController | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self.controller is not None:
                return
            log.info("efficiency gate: answering AdmissionChecks (mode %s)", self.gate.settings.mode)
            self.controller = GateController(
                self.api,
                self.gate,
                self.config,
                clock=self.clock,
                instance=self.instance,
                on_decided=self.metrics.observe if self.metrics else None,
            ).start()

    def stop(self) -> None:
        """Stop answering (a new leader may answer at once: the old controller's workers check
        their stop flag before each Workload)."""
        with self._lock:
            ctl, self.controller = self.controller, None
        if ctl is not None:
            ctl.stop()

    def close(self) -> None:
        self.stop()
        self.gate.close()
