"""The gate as the operator runs it: settings → use-case + controller, started on leadership.

Only the leader answers checks (two replicas writing check states would fight); a standby starts
the controller when it takes the Lease. The gate reads the store alone (a lineage's history and
acknowledgements), so a decision costs one indexed read.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram

from auditor.core.gate import GateMode, decide
from auditor.gate.admission import AdmissionGate, GateSettings
from auditor.gate.controller import ControllerConfig, Decided, GateController
from auditor.gate.kueue import gate_client

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


class GateRules:
    """The gate rules (``kind: GatePolicy``) of the operator's policy files, re-read while the gate
    runs so that an edited ConfigMap takes effect without a restart. ``read_files`` gives the files'
    texts; the registry re-parses only when a text changed, and a file that became invalid keeps its
    last good rules (as the cycle's policies do)."""

    def __init__(self, read_files: Callable[[], Mapping[str, str]]) -> None:
        from auditor.policy.loader import PolicyRegistry

        self.read_files = read_files
        self.registry = PolicyRegistry()
        self._texts: dict[str, str] | None = None
        self.rules: list[Any] = []

    def refresh(self) -> bool:
        """Read the files again; True when the rules changed (unchanged texts are not even parsed,
        so a bad file is reported once, not on every look)."""
        files = self.read_files()  # the operator's PolicyFiles: which are shipped (an admin's replaces one)
        texts = dict(files)
        if texts == self._texts:
            return False
        self._texts = texts
        self.registry.update(files)
        rules = [g.rule() for g in self.registry.gate_policies]
        if rules == self.rules:
            return False
        self.rules = rules
        return True


class GateStage:
    """Builds the gate from ``settings.gate`` and runs it while this replica leads."""

    def __init__(
        self,
        settings: Any,
        api: Any,
        store: Any,
        rules: Sequence[Any] | GateRules,
        *,
        clock: Callable[[], datetime],
        instance: str,
        registry: CollectorRegistry | None = None,
    ) -> None:
        from auditor.store.lineage import AckLog, LineageHistoryReader

        g = settings.gate
        #: re-read every sweep interval while leading (None: the rules given stay)
        self.rules: GateRules | None = None
        if isinstance(rules, GateRules):
            self.rules = rules
            rules.refresh()
            first = rules.rules
        else:
            first = list(rules)
        self.gate = AdmissionGate(
            LineageHistoryReader(store),
            core_decide,
            first,
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
        # its watches (3), workers, the tell pool (2) and the sweep, beside the operator's own client
        self.api = gate_client(api, self.config.workers + 8)
        self.clock = clock
        self.instance = instance
        self.controller: GateController | None = None
        self._lock = threading.Lock()
        self._reload_stop = threading.Event()
        self._reloader: threading.Thread | None = None

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
            if self.rules is not None:
                self._reload_stop.clear()
                self._reloader = threading.Thread(target=self._reload_loop, name="gate-rules", daemon=True)
                self._reloader.start()

    def reload_rules(self) -> bool:
        """Take the policy files' current gate rules (True when they changed); the next decision
        uses them (one attribute swap: a decision reads the rules once)."""
        if self.rules is None or not self.rules.refresh():
            return False
        self.gate.rules = self.rules.rules
        names = ", ".join(r.name for r in self.rules.rules) or "none"
        log.info("efficiency gate: rules changed, now %d: %s", len(self.rules.rules), names)
        return True

    def _reload_loop(self) -> None:
        while not self._reload_stop.wait(self.config.sweep_interval):
            try:
                self.reload_rules()
            except Exception as exc:  # noqa: BLE001 - the rules in force stay; the next look retries
                log.warning("efficiency gate: could not re-read the policy files: %s", exc)

    def stop(self) -> None:
        """Stop answering (a new leader may answer at once: the old controller's workers check
        their stop flag before each Workload)."""
        with self._lock:
            ctl, self.controller = self.controller, None
            reloader, self._reloader = self._reloader, None
        self._reload_stop.set()
        if reloader is not None:
            reloader.join(timeout=5)
        if ctl is not None:
            ctl.stop()

    def close(self) -> None:
        self.stop()
        self.gate.close()
        self.api.close()
