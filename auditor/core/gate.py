"""The efficiency gate's decision: admit, admit at probation priority, or hold a re-submission.

``decide(history, rules, mode, now)`` reads a lineage's past runs (their verdicts and findings)
and its acknowledgements and snoozes, and says what the gate does with the next submission of
that lineage, why, and on which evidence. It is pure and fast (the admission path calls it while
a Workload waits): no I/O, ``now`` passed in, so the same function also replays stored history
for ``policy simulate`` (:func:`replay`).

Semantics (docs/policies.md, "Gate rules"):

- A run counts when it has a judgement (``insufficient_data`` never counts, like everywhere else)
  and started at or before ``now``.
- An acknowledgement covers the runs that started before it was made, while it is valid
  (``until`` unset, or still ahead). Runs after it count again: the owner said "I know", not
  "never look again".
- A snooze admits every submission of the lineage until it ends.
- A rule fires when at least ``at_least`` of the last ``of_last`` counted runs (within ``within``
  of ``now`` when set) are flagged: their verdict is one of ``verdicts`` or they carry one of
  ``findings``. Holds are checked before deprioritizations; among equals, the first rule wins.
- ``observe`` mode decides the same, but always admits and says what ``enforce`` would do.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Iterable, Sequence

from auditor.core.lineage import LineageKey

#: a run without a judgement never counts
NO_JUDGEMENT = frozenset({"insufficient_data", ""})


class GateMode(str, Enum):
    """``observe`` (the default) decides and records but always admits; ``enforce`` acts."""

    OBSERVE = "observe"
    ENFORCE = "enforce"

    def __str__(self) -> str:
        return self.value


class GateAction(str, Enum):
    """What the gate does with a submission."""

    ADMIT = "admit"
    DEPRIORITIZE = "admit-deprioritized"
    HOLD = "hold"

    def __str__(self) -> str:
        return self.value


class AckKind(str, Enum):
    """An acknowledgement covers the runs before it; a snooze admits everything until it ends."""

    ACK = "ack"
    SNOOZE = "snooze"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class LineageRun:
    """One run of a lineage (one audited job) as the gate weighs it."""

    job: str  # Kind/name
    verdict: str
    start: datetime | None = None
    end: datetime | None = None
    uid: str | None = None
    findings: tuple[str, ...] = ()
    gpu_hours: float | None = None
    waste_gpu_hours: float | None = None
    final: bool = False

    @property
    def when(self) -> datetime | None:
        """When the run was submitted, as near as the audit knows (its first sample)."""
        return self.start or self.end

    @property
    def judged(self) -> bool:
        return self.verdict not in NO_JUDGEMENT

    def brief(self) -> str:
        """``Job/train-7f9c2 low_sm_efficiency (2026-11-30)``: one evidence line."""
        day = f" ({self.when.date().isoformat()})" if self.when else ""
        return f"{self.job} {self.verdict}{day}"


@dataclass(frozen=True, slots=True)
class Acknowledgement:
    """Who acknowledged (or snoozed) a lineage, when, until when, why, and through what."""

    by: str
    at: datetime
    until: datetime | None = None
    reason: str = ""
    kind: AckKind = AckKind.ACK
    via: str = "cli"  # cli | link | annotation | api

    def valid(self, now: datetime) -> bool:
        """Made at or before ``now`` and not expired."""
        return self.at <= now and (self.until is None or now < self.until)


@dataclass(frozen=True, slots=True)
class LineageHistory:
    """What the store knows of one lineage: its runs (oldest first) and acknowledgements."""

    key: LineageKey
    runs: tuple[LineageRun, ...] = ()
    acks: tuple[Acknowledgement, ...] = ()
    team: str = ""

    def acknowledged(self, now: datetime) -> Acknowledgement | None:
        """The latest valid acknowledgement (not snooze) at ``now``, or None."""
        valid = [a for a in self.acks if a.kind is AckKind.ACK and a.valid(now)]
        return max(valid, key=lambda a: a.at) if valid else None

    def snoozed(self, now: datetime) -> Acknowledgement | None:
        """The valid snooze that lasts longest at ``now``, or None."""
        valid = [a for a in self.acks if a.kind is AckKind.SNOOZE and a.valid(now)]
        return max(valid, key=lambda a: a.until or a.at) if valid else None

    def counted(self, now: datetime) -> list[LineageRun]:
        """The judged runs submitted by ``now`` and not covered by an acknowledgement, oldest first."""
        ack = self.acknowledged(now)
        out = [r for r in self.runs if r.judged and r.when is not None and r.when <= now]
        if ack is not None:
            out = [r for r in out if r.when is not None and r.when >= ack.at]
        return sorted(out, key=lambda r: (r.when, r.job))

    def open_findings(self, now: datetime) -> list[str]:
        """The finding codes of the counted runs (not acknowledged), most frequent first."""
        counts: dict[str, int] = {}
        for r in self.counted(now):
            for code in r.findings:
                counts[code] = counts.get(code, 0) + 1
        return sorted(counts, key=lambda c: (-counts[c], c))


@dataclass(frozen=True, slots=True)
class GateRule:
    """One gate rule (a ``GatePolicy`` document, auditor/policy/schema.py, validated there).

    Fires when at least ``at_least`` of the last ``of_last`` counted runs (all of them when None)
    that started within ``within`` before now (any time when None) are flagged. A hold lasts
    until acknowledged (or until the flagged runs fall out of ``within``/``of_last``); a
    deprioritization the same, with ``priority_class`` naming the probation class (the settings'
    ``gate.probation_priority_class`` when None).
    """

    name: str
    action: GateAction
    verdicts: frozenset[str] = frozenset()
    findings: frozenset[str] = frozenset()
    at_least: int = 1
    of_last: int | None = None
    within: timedelta | None = None
    priority_class: str | None = None
    namespaces: tuple[str, ...] = ()
    exclude_namespaces: tuple[str, ...] = ()
    teams: tuple[str, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        if self.action is GateAction.ADMIT:
            raise ValueError("a gate rule holds or deprioritizes; admitting is what happens when none fires")
        if self.at_least < 1 or (self.of_last is not None and self.of_last < self.at_least):
            raise ValueError(f"rule {self.name}: at_least must be 1..of_last")
        if not self.verdicts and not self.findings:
            raise ValueError(f"rule {self.name}: needs verdicts or findings to flag a run")

    def flags(self, run: LineageRun) -> bool:
        return run.verdict in self.verdicts or any(code in self.findings for code in run.findings)

    def selects(self, key: LineageKey, team: str) -> bool:
        if self.namespaces and not _glob_any(key.namespace, self.namespaces):
            return False
        if _glob_any(key.namespace, self.exclude_namespaces):
            return False
        return not self.teams or _glob_any(team, self.teams)

    def describe(self) -> str:
        what = sorted(self.verdicts) + sorted(self.findings)
        last = f" of its last {self.of_last} runs" if self.of_last else (" run" if self.at_least == 1 else " runs")
        within = f" within {_span(self.within)}" if self.within else ""
        return f"flagged {'/'.join(what)} in {self.at_least}{last}{within}"


@dataclass(frozen=True)
class GateDecision:
    """What the gate does with one submission of a lineage (the contract with the Kueue side).

    ``action`` is what is done; ``would`` what ``enforce`` would do (they differ only in
    ``observe`` mode); ``reason`` one line for a Workload message; ``evidence`` short strings
    (the flagged runs); ``rule`` the rule that fired (None when admitted clean);
    ``acknowledged_until`` the end of the acknowledgement or snooze that let it through, when one
    did (None for one without end: ``acknowledged_by`` says who); ``until`` when the action lapses
    by itself (a flagged run leaves the rule's ``within``), None when only an acknowledgement
    ends it.
    """

    action: GateAction
    would: GateAction
    reason: str
    evidence: list[str] = field(default_factory=list)
    rule: str | None = None
    acknowledged_until: datetime | None = None
    acknowledged_by: str | None = None
    mode: GateMode = GateMode.OBSERVE
    until: datetime | None = None
    priority_class: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "action": self.action.value,
            "would": self.would.value,
            "reason": self.reason,
            "evidence": list(self.evidence),
            "rule": self.rule,
            "acknowledged_until": _iso(self.acknowledged_until),
            "acknowledged_by": self.acknowledged_by,
            "mode": self.mode.value,
            "until": _iso(self.until),
            "priority_class": self.priority_class,
        }


@dataclass(frozen=True, slots=True)
class _Firing:
    rule: GateRule
    flagged: list[LineageRun]
    until: datetime | None


def _fire(rule: GateRule, runs: list[LineageRun], now: datetime) -> _Firing | None:
    if rule.within is not None:
        runs = [r for r in runs if r.when is not None and r.when >= now - rule.within]
    if rule.of_last is not None:
        runs = runs[-rule.of_last :]
    flagged = [r for r in runs if rule.flags(r)]
    if len(flagged) < rule.at_least:
        return None
    until = None
    if rule.within is not None:
        # it lapses when the at_least-th newest flagged run leaves the window
        pivot = flagged[-rule.at_least].when
        until = pivot + rule.within if pivot is not None else None
    return _Firing(rule, flagged, until)


_SEVERITY = {GateAction.HOLD: 0, GateAction.DEPRIORITIZE: 1}


def decide(
    history: LineageHistory,
    rules: Sequence[GateRule],
    mode: GateMode | str,
    now: datetime,
    *,
    ack_hint: str = "",
) -> GateDecision:
    """What the gate does with the next submission of ``history``'s lineage at ``now``.

    ``mode`` is a :class:`GateMode` or its value (``observe``, ``enforce``: ValueError else).
    ``ack_hint`` (e.g. ``gpu-auditor ack ml/train``) is appended to the reason of a hold, so the
    owner reads how to release it where they read why.
    """
    mode = GateMode(mode)
    snooze = history.snoozed(now)
    if snooze is not None:
        until = f" until {_iso(snooze.until)}" if snooze.until else ""
        return GateDecision(
            GateAction.ADMIT,
            GateAction.ADMIT,
            f"snoozed by {snooze.by}{until}" + (f": {snooze.reason}" if snooze.reason else ""),
            acknowledged_until=snooze.until,
            acknowledged_by=snooze.by,
            mode=mode,
        )
    counted = history.counted(now)
    applicable = [r for r in rules if r.selects(history.key, history.team)]
    firing = _first(_fire(r, counted, now) for r in _by_severity(applicable))
    if firing is None:
        return _clean(history, applicable, mode, now)
    rule = firing.rule
    evidence = [r.brief() for r in firing.flagged]
    what = "hold" if rule.action is GateAction.HOLD else "deprioritize"
    lapse = f" until {_iso(firing.until)}" if firing.until else " until acknowledged"
    reason = f"{what}{lapse}: lineage {history.key} {rule.describe()} (rule {rule.name})"
    if rule.action is GateAction.HOLD and ack_hint:
        reason += f"; to release: {ack_hint}"
    action = rule.action if mode is GateMode.ENFORCE else GateAction.ADMIT
    if mode is GateMode.OBSERVE:
        reason = "would " + reason
    return GateDecision(
        action,
        rule.action,
        reason,
        evidence=evidence,
        rule=rule.name,
        mode=mode,
        until=firing.until,
        priority_class=rule.priority_class if rule.action is GateAction.DEPRIORITIZE else None,
    )


def _clean(history: LineageHistory, rules: Sequence[GateRule], mode: GateMode, now: datetime) -> GateDecision:
    """Admit; when an acknowledgement is what let it through, say so (and whose)."""
    ack = history.acknowledged(now)
    if ack is not None:
        covered = LineageHistory(history.key, history.runs, (), history.team)
        without = _first(_fire(r, covered.counted(now), now) for r in _by_severity(rules))
        if without is not None:
            until = f" until {_iso(ack.until)}" if ack.until else ""
            return GateDecision(
                GateAction.ADMIT,
                GateAction.ADMIT,
                f"acknowledged by {ack.by}{until}" + (f": {ack.reason}" if ack.reason else ""),
                evidence=[r.brief() for r in without.flagged],
                acknowledged_until=ack.until,
                acknowledged_by=ack.by,
                mode=mode,
            )
    return GateDecision(GateAction.ADMIT, GateAction.ADMIT, f"lineage {history.key}: no gate rule fires", mode=mode)


@dataclass(frozen=True, slots=True)
class Replayed:
    """One past submission and what the gate would have done with it then."""

    run: LineageRun
    decision: GateDecision


def replay(history: LineageHistory, rules: Sequence[GateRule], *, since: datetime | None = None) -> list[Replayed]:
    """What ``enforce`` would have done with each past submission (``policy simulate``).

    Each run is decided as of its own submission time, on the runs before it and the
    acknowledgements made by then (a run never weighs on itself).
    """
    out = []
    for run in sorted((r for r in history.runs if r.when is not None), key=lambda r: (r.when, r.job)):
        when = run.when
        assert when is not None
        if since is not None and when < since:
            continue
        before = tuple(r for r in history.runs if r is not run and r.when is not None and r.when < when)
        past = LineageHistory(history.key, before, history.acks, history.team)
        out.append(Replayed(run, decide(past, rules, GateMode.ENFORCE, when)))
    return out


def _by_severity(rules: Sequence[GateRule]) -> list[GateRule]:
    """Holds first, then deprioritizations; the given order among equals (sorted is stable)."""
    return sorted(rules, key=lambda r: _SEVERITY[r.action])


def _first(items: Iterable[_Firing | None]) -> _Firing | None:
    return next((x for x in items if x is not None), None)


def _glob_any(value: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in patterns)


def _iso(t: datetime | None) -> str | None:
    return t.isoformat().replace("+00:00", "Z") if t is not None else None


def _span(d: timedelta) -> str:
    if d % timedelta(days=1) == timedelta(0):
        return f"{d.days}d"
    if d % timedelta(hours=1) == timedelta(0):
        return f"{int(d.total_seconds() // 3600)}h"
    return f"{int(d.total_seconds() // 60)}m"
