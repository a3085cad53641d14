"""The admission use-case: what the efficiency gate's check says for one Workload's lineage.

Kueue holds a Workload's quota while our check is ``Pending``, so the answer must come fast and
must come at all: the store read runs under a deadline (``GateSettings.timeout``), and a failure
or a timeout becomes an admission that says why (fail-open, the default) or, when the admin chose
fail-closed, a rejection that releases the quota (the release sweep re-admits it once the store
answers). Observe mode always admits and says what enforce would have done.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from auditor.clock import SYSTEM_CLOCK
from auditor.errors import AuditorError, BadInput
from auditor.gate.ports import AckRecorder, Decide, Decision, HistoryReader, Key
from auditor.ports import Clock

log = logging.getLogger(__name__)

READY, RETRY, REJECTED = "Ready", "Retry", "Rejected"
MODES = ("observe", "enforce")
#: Kueue's limit on an AdmissionCheckState message
MESSAGE_MAX = 32768


@dataclass(frozen=True)
class GateSettings:
    """How the gate decides: ``mode`` observe|enforce, the deadline for one decision (seconds) and
    what a missing decision means (``fail_closed`` False: admit with a message)."""

    mode: str = "observe"
    timeout: float = 2.0
    fail_closed: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise BadInput(f"gate.mode: {self.mode!r} is not one of {', '.join(MODES)}")
        if not self.timeout > 0:
            raise BadInput(f"gate.timeout: must be positive, got {self.timeout}")


@dataclass(frozen=True)
class Verdict:
    """The check's answer for one Workload: its ``state`` (Ready|Rejected) and ``message``, the
    core's decision (None when none could be made: ``failure`` says why), and what it means for
    the holds list (``hold``: enforce holds this lineage; ``probation``: admit it at probation
    priority)."""

    key: Key
    state: str
    message: str
    decision: Decision | None
    failure: str | None
    seconds: float

    @property
    def hold(self) -> bool:
        return self.state == REJECTED and self.decision is not None

    @property
    def probation(self) -> bool:
        return self.decision is not None and self.decision.action == "admit-deprioritized"

    @property
    def would(self) -> str:
        """What enforce would have done ("" without a decision)."""
        return self.decision.would if self.decision is not None else ""


def lineage_name(key: Key) -> str:
    return f"{key.namespace}/{key.lineage}"


def ack_hint(key: Key) -> str:
    """How the owner releases a hold (the message, the Event and the annotation all say it)."""
    return f"acknowledge with `gpu-auditor ack {lineage_name(key)}`"


def _evidence(d: Decision) -> str:
    ev = "; ".join(str(e) for e in list(d.evidence)[:5])
    return f" ({ev})" if ev else ""


class AdmissionGate:
    """Decides the check state of Workloads: reads the lineage's history through ``reader`` under
    the deadline, asks the pure ``decide`` with ``rules``, words the message."""

    def __init__(
        self,
        reader: HistoryReader,
        decide: Decide,
        rules: Any,
        settings: GateSettings,
        *,
        acks: AckRecorder | None = None,
        workers: int = 8,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        #: times each decision against the settings' deadline
        self.clock = clock
        self.reader = reader
        self.decide_fn = decide
        self.rules = rules
        self.settings = settings
        self.acks = acks
        # A hung store read keeps its worker; the others (and the deadline) keep answering.
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gate-decide")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _decide(self, key: Key, now: datetime) -> Decision:
        history = self.reader.history(key, now)
        return self.decide_fn(history, self.rules, self.settings.mode, now)

    def verdict(self, key: Key, now: datetime) -> Verdict:
        """The check's state and message for a Workload of lineage ``key`` at ``now``."""
        t0 = self.clock.monotonic()
        timeout = self.settings.timeout
        decision: Decision | None = None
        failure: str | None = None
        future = self._pool.submit(self._decide, key, now)
        try:
            decision = future.result(timeout=timeout)
        except FutureTimeout:
            future.cancel()
            failure = f"no decision within {timeout:g} s (the store did not answer)"
        except AuditorError as exc:
            failure = f"the store could not be read: {exc}"
        except Exception as exc:
            log.error("gate decision for %s failed", lineage_name(key), exc_info=True)
            failure = f"the decision failed: {type(exc).__name__}: {exc}"
        seconds = self.clock.monotonic() - t0
        if decision is None:
            assert failure is not None
            return self.undecided(key, failure, seconds)
        return Verdict(key, *self._word(key, decision), decision, None, seconds)

    def undecided(self, key: Key, failure: str, seconds: float = 0.0) -> Verdict:
        """The answer when no decision was made in time (``failure`` says why): admitted with a
        message (fail-open), or rejected, freeing the quota, with ``fail_closed``."""
        if self.settings.fail_closed:
            state = REJECTED
            msg = (
                f"gpu-auditor: not admitted, {failure}; the gate is fail-closed: the job is re-admitted "
                "when the store answers again"
            )
        else:
            state = READY
            msg = f"gpu-auditor: admitted without a decision, {failure} (fail-open)"
        return Verdict(key, state, msg[:MESSAGE_MAX], None, failure, seconds)

    def _word(self, key: Key, d: Decision) -> tuple[str, str]:
        enforce = self.settings.mode == "enforce"
        if d.action == "hold" and enforce:
            msg = f"gpu-auditor: held, {d.reason}{_evidence(d)}; {ack_hint(key)} and the job is re-admitted"
            return REJECTED, msg[:MESSAGE_MAX]
        if d.action == "admit-deprioritized":
            return READY, f"gpu-auditor: admitted at probation priority, {d.reason}{_evidence(d)}"[:MESSAGE_MAX]
        if d.would != d.action and d.would in ("hold", "admit-deprioritized"):
            would = "hold" if d.would == "hold" else "admit at probation priority"
            msg = f"gpu-auditor (observe mode): admitted; enforce would {would}: {d.reason}{_evidence(d)}"
            if d.would == "hold":
                msg += f"; {ack_hint(key)}"
            return READY, msg[:MESSAGE_MAX]
        if d.acknowledged_until is not None:
            until = d.acknowledged_until.isoformat()
            return READY, f"gpu-auditor: admitted, acknowledged until {until}: {d.reason}"[:MESSAGE_MAX]
        return READY, f"gpu-auditor: admitted, {d.reason}"[:MESSAGE_MAX]

    def acknowledge(
        self, key: Key, *, by: str, reason: str, now: datetime, until: datetime | None = None, via: str = "annotation"
    ) -> None:
        """Record an acknowledgement made on the cluster (the owner removed the gate annotation)."""
        if self.acks is None:
            raise AuditorError("the gate has no acknowledgement log to record into")
        self.acks.acknowledge(key, by, until, reason, now, via=via)
