"""The audit JSON as a value: :class:`JobSummary` (one job) with its :class:`GpuSummary` rows
and :class:`MetricStats`, and the one place that writes and reads DESIGN.md's shape
(:meth:`JobSummary.to_json` / :meth:`JobSummary.from_json`).

Values are held as the JSON gives them (ratios rounded to 6 places, ``None`` for a metric that
is absent — never 0), so ``from_json(doc).to_json() == doc`` for every document the core
writes; the golden files under tests/golden/ hold the shape byte for byte. A consumer reads
attributes, so the type checker lists every reader of a field.

Adding a field: declare it here (with its JSON name), write and read it in ``to_json`` /
``from_json``, and — if the weekly report or a policy reads it — its store column
(:data:`auditor.store.summaries.SUMMARY_FIELDS`, a migration) and docs/verdicts.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from functools import lru_cache
from operator import attrgetter
from typing import Any, NamedTuple

from auditor.core.identity import JobKey, KeyedByJob
from auditor.core.metrics import Metric
from auditor.core.model import Finding, Verdict
from auditor.core.ranges import RATIO, Range
from auditor.core.rfc3339 import format_rfc3339, parse_rfc3339
from auditor.errors import PermanentError

#: the activity fields of the audit JSON (ratios 0–1), in output order
ACTIVITY_FIELDS: tuple[tuple[str, Metric], ...] = (
    ("gpu_util", Metric.GPU_UTIL),
    ("gr_engine_active", Metric.GR_ENGINE_ACTIVE),
    ("sm_active", Metric.SM_ACTIVE),
    ("sm_occupancy", Metric.SM_OCCUPANCY),
    ("tensor_active", Metric.TENSOR_ACTIVE),
    ("dram_active", Metric.DRAM_ACTIVE),
    ("fp32_active", Metric.FP32_ACTIVE),
    ("fp16_active", Metric.FP16_ACTIVE),
)
#: device readings reported as means in their own units
DEVICE_FIELDS: tuple[tuple[str, Metric], ...] = (
    ("power_w", Metric.POWER),
    ("fb_used_mib", Metric.FB_USED),
    ("sm_clock_mhz", Metric.SM_CLOCK),
    ("pcie_rx_bytes_per_s", Metric.PCIE_RX),
    ("pcie_tx_bytes_per_s", Metric.PCIE_TX),
)
MEAN_FIELDS: tuple[tuple[str, Metric], ...] = ACTIVITY_FIELDS + DEVICE_FIELDS


def measured(valid: Range) -> dict[str, Range]:
    """The metadata of a numeric field a policy condition may test: its unit and valid range (a
    value outside can never or always match, so a policy comparing with it is refused). Used as
    ``field(metadata=measured(...))`` so that mypy still sees whether the field has a default."""
    return {"range": valid}


class SummaryFormatError(PermanentError, ValueError):
    """A document that is not an audit-JSON summary (a corrupt or foreign stored record); the
    message names the field. Permanent: reading it again gives the same document."""


def rounded(v: float | None, nd: int = 6) -> float | None:
    """A value as the audit JSON holds it: rounded to ``nd`` places, None kept."""
    return None if v is None else round(v, nd)


#: RFC 3339 UTC with ``Z`` (the audit JSON's times); remembered, since a cycle's documents
#: repeat the same few times (the window, now, the GPUs' common start and end)
rfc3339 = lru_cache(maxsize=4096)(format_rfc3339)


def _time(text: object, what: str) -> datetime:
    try:
        return parse_rfc3339(text)
    except ValueError as exc:
        raise SummaryFormatError(f"{what}: {exc}") from None


# --------------------------------------------------------------------------- field readers


def _get(doc: Mapping[str, Any], key: str, what: str) -> Any:
    if key not in doc:
        raise SummaryFormatError(f"{what}.{key}: missing")
    return doc[key]


def _str(doc: Mapping[str, Any], key: str, what: str) -> str:
    v = _get(doc, key, what)
    if not isinstance(v, str):
        raise SummaryFormatError(f"{what}.{key}: expected a string, got {v!r}")
    return v


def _opt_str(doc: Mapping[str, Any], key: str, what: str) -> str | None:
    v = doc.get(key)
    if v is not None and not isinstance(v, str):
        raise SummaryFormatError(f"{what}.{key}: expected a string or null, got {v!r}")
    return v


def _num(v: object, what: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SummaryFormatError(f"{what}: expected a number or null, got {v!r}")
    return v


def _opt_num(doc: Mapping[str, Any], key: str, what: str) -> float | None:
    return _num(doc.get(key), f"{what}.{key}")


def _int(doc: Mapping[str, Any], key: str, what: str) -> int:
    v = _get(doc, key, what)
    if isinstance(v, bool) or not isinstance(v, int):
        raise SummaryFormatError(f"{what}.{key}: expected an integer, got {v!r}")
    return v


def _metric(v: object, what: str) -> Metric | None:
    if v is None:
        return None
    try:
        return Metric(v)
    except ValueError:
        raise SummaryFormatError(f"{what}: unknown metric {v!r}") from None


def _verdict(v: object, what: str) -> Verdict:
    try:
        return Verdict(v)
    except ValueError:
        raise SummaryFormatError(f"{what}: unknown verdict {v!r}") from None


def _stats(doc: Mapping[str, Any], what: str) -> dict[Metric, MetricStats]:
    raw = doc.get("stats") or {}
    if not isinstance(raw, Mapping):
        raise SummaryFormatError(f"{what}.stats: expected an object")
    out: dict[Metric, MetricStats] = {}
    for name, st in raw.items():
        m = _metric(name, f"{what}.stats")
        assert m is not None
        out[m] = MetricStats.from_json(st, f"{what}.stats.{name}")
    return out


def _stats_json(stats: Mapping[Metric, MetricStats]) -> dict[str, object]:
    # a Metric is a str enum whose str is its value: sorting the members sorts by value
    return {_VALUE[m]: dict(zip(_METRIC_STATS_KEYS, stats[m])) for m in sorted(stats)}


_VALUE = {m: m.value for m in Metric}


# --------------------------------------------------------------------------- values


class MetricStats(NamedTuple):
    """One metric's statistics over a job or a GPU: ``samples`` valid, ``dropped`` garbage;
    percentiles over the bucket means (:mod:`auditor.core.summary` says how).

    A named tuple rather than a frozen dataclass: a cycle makes one per metric of every GPU of
    every job (99 for a job of 10 GPUs), and a frozen dataclass costs one ``object.__setattr__``
    per field; the JSON is its fields in order."""

    mean: float | None
    p10: float | None
    p50: float | None
    p90: float | None
    min: float | None
    max: float | None
    samples: int
    dropped: int

    def to_json(self) -> dict[str, object]:
        return dict(zip(_METRIC_STATS_KEYS, self))

    @classmethod
    def from_json(cls, doc: object, what: str = "stats") -> MetricStats:
        if not isinstance(doc, Mapping):
            raise SummaryFormatError(f"{what}: expected an object")
        return cls(
            mean=_opt_num(doc, "mean", what),
            p10=_opt_num(doc, "p10", what),
            p50=_opt_num(doc, "p50", what),
            p90=_opt_num(doc, "p90", what),
            min=_opt_num(doc, "min", what),
            max=_opt_num(doc, "max", what),
            samples=_int(doc, "samples", what),
            dropped=_int(doc, "dropped", what),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Means:
    """The means of :data:`MEAN_FIELDS` (``None``: the metric is absent) of a job or of one of
    its GPUs; flat in the audit JSON, one value here so that a summary is built with every
    other field named (a ``**`` spread would hide a missing one from the type checker)."""

    gpu_util: float | None = field(default=None, metadata=measured(RATIO))
    gr_engine_active: float | None = field(default=None, metadata=measured(RATIO))
    sm_active: float | None = field(default=None, metadata=measured(RATIO))
    sm_occupancy: float | None = field(default=None, metadata=measured(RATIO))
    tensor_active: float | None = field(default=None, metadata=measured(RATIO))
    dram_active: float | None = field(default=None, metadata=measured(RATIO))
    fp32_active: float | None = field(default=None, metadata=measured(RATIO))
    fp16_active: float | None = field(default=None, metadata=measured(RATIO))
    # the limits beyond which a source drops a sample as garbage (auditor/core/metrics.py)
    power_w: float | None = field(default=None, metadata=measured(Range("W", 0.0, 5_000.0)))
    fb_used_mib: float | None = field(default=None, metadata=measured(Range("MiB", 0.0, 16_777_216.0)))
    sm_clock_mhz: float | None = field(default=None, metadata=measured(Range("MHz", 0.0, 10_000.0)))
    pcie_rx_bytes_per_s: float | None = None
    pcie_tx_bytes_per_s: float | None = None

    def to_json(self) -> dict[str, object]:
        return dict(zip(_MEAN_KEYS, _MEANS_OF(self)))

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], what: str) -> Means:
        return cls(**{name: _opt_num(doc, name, what) for name, _ in MEAN_FIELDS})

    @classmethod
    def of(cls, mean: Callable[[Metric], float | None]) -> Means:
        """From a mean per metric (rounded as the audit JSON holds them)."""
        return cls(**{name: rounded(mean(m)) for name, m in MEAN_FIELDS})

    def of_metric(self, metric: Metric) -> float | None:
        """The mean of ``metric`` where the audit JSON has one (else None)."""
        return getattr(self, _MEAN_NAME[metric]) if metric in _MEAN_NAME else None


_MEAN_NAME = {m: name for name, m in MEAN_FIELDS}
_MEAN_KEYS = tuple(name for name, _ in MEAN_FIELDS)
_MEANS_OF = attrgetter(*_MEAN_KEYS)
#: the JSON keys of :class:`MetricStats`, its fields in order
_METRIC_STATS_KEYS = MetricStats._fields


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSummary:
    """One (pod, GPU) row of a job's ``per_gpu`` breakdown, with its own verdict."""

    pod: str
    namespace: str
    container: str | None
    gpu: str | None
    uuid: str
    mig_instance: str | None
    mig_profile: str | None
    hostname: str | None
    gpu_model: str | None
    fraction: float | None
    start: datetime
    end: datetime
    gpu_hours: float | None
    coverage: float | None
    busy_signal: Metric | None
    means: Means
    mfu_estimate: float | None
    waste_gpu_hours: float | None
    shared_with_pods: int
    verdict: Verdict
    stats: Mapping[Metric, MetricStats] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "pod": self.pod,
            "namespace": self.namespace,
            "container": self.container,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "mig_instance": self.mig_instance,
            "mig_profile": self.mig_profile,
            "hostname": self.hostname,
            "gpu_model": self.gpu_model,
            "fraction": self.fraction,
            "start": rfc3339(self.start),
            "end": rfc3339(self.end),
            "gpu_hours": self.gpu_hours,
            "coverage": self.coverage,
            "busy_signal": self.busy_signal.value if self.busy_signal else None,
            **self.means.to_json(),
            "mfu_estimate": self.mfu_estimate,
            "waste_gpu_hours": self.waste_gpu_hours,
            "shared_with_pods": self.shared_with_pods,
            "verdict": self.verdict.value,
            "stats": _stats_json(self.stats),
        }

    @classmethod
    def from_json(cls, doc: object, what: str = "per_gpu") -> GpuSummary:
        if not isinstance(doc, Mapping):
            raise SummaryFormatError(f"{what}: expected an object")
        return cls(
            pod=_str(doc, "pod", what),
            namespace=_str(doc, "namespace", what),
            container=_opt_str(doc, "container", what),
            gpu=_opt_str(doc, "gpu", what),
            uuid=_str(doc, "uuid", what),
            mig_instance=_opt_str(doc, "mig_instance", what),
            mig_profile=_opt_str(doc, "mig_profile", what),
            hostname=_opt_str(doc, "hostname", what),
            gpu_model=_opt_str(doc, "gpu_model", what),
            fraction=_opt_num(doc, "fraction", what),
            start=_time(_get(doc, "start", what), f"{what}.start"),
            end=_time(_get(doc, "end", what), f"{what}.end"),
            gpu_hours=_opt_num(doc, "gpu_hours", what),
            coverage=_opt_num(doc, "coverage", what),
            busy_signal=_metric(doc.get("busy_signal"), f"{what}.busy_signal"),
            means=Means.from_json(doc, what),
            mfu_estimate=_opt_num(doc, "mfu_estimate", what),
            waste_gpu_hours=_opt_num(doc, "waste_gpu_hours", what),
            shared_with_pods=_int(doc, "shared_with_pods", what),
            verdict=_verdict(_get(doc, "verdict", what), f"{what}.verdict"),
            stats=_stats(doc, what),
        )


def finding_to_json(f: Finding) -> dict[str, object]:
    return {"code": f.code, "message": f.message, "evidence": f.evidence}


def finding_from_json(doc: object, what: str = "findings") -> Finding:
    if not isinstance(doc, Mapping):
        raise SummaryFormatError(f"{what}: expected an object")
    evidence = doc.get("evidence") or {}
    if not isinstance(evidence, dict):
        raise SummaryFormatError(f"{what}.evidence: expected an object")
    return Finding(_str(doc, "code", what), _str(doc, "message", what), evidence)


#: fields the operator's cycle adds to a job's summary (when it saw the job end), emitted only when set
LIFECYCLE_FIELDS = ("final", "ended")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSummary(KeyedByJob):
    """One job's audit-JSON summary (DESIGN.md "Audit JSON").

    ``final``/``ended`` are the operator's: whether the job has ended and settled (its summary
    will not change again) and when; ``None`` where nothing said (an ``audit``). ``extra`` keeps
    what another writer added to a stored document, so reading and writing it loses nothing.
    """

    key: JobKey
    uid: str | None
    team: str
    queue: str | None
    gpu_model: str | None
    gpus: float | None = field(metadata=measured(Range("GPUs")))
    pods: tuple[str, ...]
    start: datetime
    end: datetime
    gpu_hours: float | None = field(metadata=measured(Range("GPU-hours")))
    busy_signal: Metric | None
    means: Means
    coverage: float | None = field(metadata=measured(RATIO))
    mfu_estimate: float | None = field(metadata=measured(RATIO))
    #: the MFU the estimate is measured against (issue 28; auditor/core/mfu.py) and its source:
    #: a workload class's name or ``lineage-best``; None when no reference applies
    mfu_reference: float | None = field(default=None, metadata=measured(RATIO))
    mfu_class: str | None = None
    waste_gpu_hours: float | None = field(metadata=measured(Range("GPU-hours")))
    #: GPU-hours the job would not have needed at its reference MFU (the MFU gap; null without one)
    recoverable_gpu_hours: float | None = field(default=None, metadata=measured(Range("GPU-hours")))
    verdict: Verdict
    findings: tuple[Finding, ...]
    stats: Mapping[Metric, MetricStats]
    per_gpu: tuple[GpuSummary, ...]
    window_start: datetime
    window_end: datetime
    scrape_interval_s: float | None
    computed_at: datetime
    final: bool | None = None
    ended: datetime | None = None
    extra: Mapping[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """The plain-JSON document (key order as DESIGN.md and the golden files have it)."""
        out: dict[str, object] = {
            **self.key.fields(),
            "uid": self.uid,
            "team": self.team,
            "queue": self.queue,
            "gpu_model": self.gpu_model,
            "gpus": self.gpus,
            "pods": list(self.pods),
            "start": rfc3339(self.start),
            "end": rfc3339(self.end),
            "gpu_hours": self.gpu_hours,
            "busy_signal": self.busy_signal.value if self.busy_signal else None,
            **self.means.to_json(),
            "coverage": self.coverage,
            "mfu_estimate": self.mfu_estimate,
            "mfu_reference": self.mfu_reference,
            "mfu_class": self.mfu_class,
            "waste_gpu_hours": self.waste_gpu_hours,
            "recoverable_gpu_hours": self.recoverable_gpu_hours,
            "verdict": self.verdict.value,
            "findings": [finding_to_json(f) for f in self.findings],
            "stats": _stats_json(self.stats),
            "per_gpu": [g.to_json() for g in self.per_gpu],
            "window": {"start": rfc3339(self.window_start), "end": rfc3339(self.window_end)},
            "scrape_interval_s": self.scrape_interval_s,
            "computed_at": rfc3339(self.computed_at),
        }
        if self.final is not None:
            out["final"] = self.final
            out["ended"] = rfc3339(self.ended) if self.ended is not None else None
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    @classmethod
    def from_json(cls, doc: object, what: str = "summary") -> JobSummary:
        """Read a document :meth:`to_json` wrote (or an older one of the same shape); a
        :class:`SummaryFormatError` names the first field that does not fit."""
        if not isinstance(doc, Mapping):
            raise SummaryFormatError(f"{what}: expected an object")
        try:
            key = JobKey.of(_str(doc, "cluster", what), _str(doc, "namespace", what), _str(doc, "job", what))
        except ValueError as exc:
            raise SummaryFormatError(f"{what}.job: {exc}") from None
        window = _get(doc, "window", what)
        if not isinstance(window, Mapping):
            raise SummaryFormatError(f"{what}.window: expected an object")
        pods = doc.get("pods") or []
        findings = doc.get("findings") or []
        per_gpu = doc.get("per_gpu") or []
        if not isinstance(pods, list) or not all(isinstance(p, str) for p in pods):
            raise SummaryFormatError(f"{what}.pods: expected a list of pod names")
        if not isinstance(findings, list) or not isinstance(per_gpu, list):
            raise SummaryFormatError(f"{what}: findings and per_gpu must be lists")
        final = doc.get("final")
        if final is not None and not isinstance(final, bool):
            raise SummaryFormatError(f"{what}.final: expected true, false or null, got {final!r}")
        ended = doc.get("ended")
        return cls(
            key=key,
            uid=_opt_str(doc, "uid", what),
            team=_str(doc, "team", what),
            queue=_opt_str(doc, "queue", what),
            gpu_model=_opt_str(doc, "gpu_model", what),
            gpus=_opt_num(doc, "gpus", what),
            pods=tuple(pods),
            start=_time(_get(doc, "start", what), f"{what}.start"),
            end=_time(_get(doc, "end", what), f"{what}.end"),
            gpu_hours=_opt_num(doc, "gpu_hours", what),
            busy_signal=_metric(doc.get("busy_signal"), f"{what}.busy_signal"),
            means=Means.from_json(doc, what),
            coverage=_opt_num(doc, "coverage", what),
            mfu_estimate=_opt_num(doc, "mfu_estimate", what),
            mfu_reference=_opt_num(doc, "mfu_reference", what),
            mfu_class=_opt_str(doc, "mfu_class", what),
            waste_gpu_hours=_opt_num(doc, "waste_gpu_hours", what),
            recoverable_gpu_hours=_opt_num(doc, "recoverable_gpu_hours", what),
            verdict=_verdict(_get(doc, "verdict", what), f"{what}.verdict"),
            findings=tuple(finding_from_json(f, f"{what}.findings[{i}]") for i, f in enumerate(findings)),
            stats=_stats(doc, what),
            per_gpu=tuple(GpuSummary.from_json(g, f"{what}.per_gpu[{i}]") for i, g in enumerate(per_gpu)),
            window_start=_time(_get(window, "start", f"{what}.window"), f"{what}.window.start"),
            window_end=_time(_get(window, "end", f"{what}.window"), f"{what}.window.end"),
            scrape_interval_s=_opt_num(doc, "scrape_interval_s", what),
            computed_at=_time(_get(doc, "computed_at", what), f"{what}.computed_at"),
            final=final,
            ended=_time(ended, f"{what}.ended") if ended is not None else None,
            extra={k: v for k, v in doc.items() if k not in _JSON_KEYS},
        )

    @classmethod
    def example(cls, **fields: object) -> JobSummary:
        """A summary for examples and tests (policy suites, fast tests): a one-GPU job
        ``examples/Job/example`` with nothing measured, and ``fields`` (by their audit-JSON
        names, e.g. ``gpu_util=0.2, verdict="idle"``) over it; read by :meth:`from_json`, so a
        wrong name or type fails as a stored document would."""
        return cls.from_json({**_EXAMPLE, **fields}, "example")

    def value_of(self, name: str) -> object:
        """A top-level field by its audit-JSON name (what a policy condition names), or None."""
        if name in _MEAN_NAMES:
            return getattr(self.means, name)
        if name in _SCALAR_NAMES:
            v = getattr(self, name)
            return v.value if isinstance(v, (Verdict, Metric)) else v
        if name in ("cluster", "namespace", "job"):
            return getattr(self.key, name)
        return None


#: the document :meth:`JobSummary.example` starts from
_EXAMPLE: dict[str, object] = {
    "cluster": "examples",
    "namespace": "examples",
    "job": "Job/example",
    "uid": None,
    "team": "examples",
    "queue": None,
    "gpu_model": None,
    "gpus": None,
    "pods": [],
    # a start at the examples' now: a sustained condition's warm-up starts at the first bucket
    "start": "2026-11-30T12:00:00Z",
    "end": "2026-11-30T12:00:00Z",
    "gpu_hours": None,
    "busy_signal": None,
    "coverage": None,
    "mfu_estimate": None,
    "mfu_reference": None,
    "mfu_class": None,
    "waste_gpu_hours": None,
    "recoverable_gpu_hours": None,
    "verdict": "healthy",
    "findings": [],
    "stats": {},
    "per_gpu": [],
    "window": {"start": "2026-11-30T11:00:00Z", "end": "2026-11-30T12:00:00Z"},
    "scrape_interval_s": None,
    "computed_at": "2026-11-30T12:00:00Z",
}

#: every key :meth:`JobSummary.to_json` writes itself
_JSON_KEYS = frozenset(
    {"cluster", "namespace", "job", "window", *LIFECYCLE_FIELDS}
    | {f.name for f in fields(JobSummary) if f.name not in ("key", "means", "window_start", "window_end", "extra")}
    | {name for name, _ in MEAN_FIELDS}
)
_MEAN_NAMES = frozenset(name for name, _ in MEAN_FIELDS)
#: the top-level fields that hold one number or string (what policies and store columns read)
_SCALAR_NAMES = frozenset(
    f.name
    for f in fields(JobSummary)
    if f.name not in ("key", "means", "pods", "findings", "stats", "per_gpu", "extra", "final", "ended")
)


def numeric_fields() -> tuple[str, ...]:
    """The audit JSON's top-level numeric fields (type ``float | None``), in declaration order."""
    return tuple(f.name for f in (*fields(Means), *fields(JobSummary)) if f.type in ("float | None",))


def policy_fields() -> dict[str, Range]:
    """The fields a policy condition may test, each with its unit and valid range, in the
    audit JSON's order: every field declared with :func:`measured`."""
    return {f.name: f.metadata["range"] for f in (*fields(Means), *fields(JobSummary)) if "range" in f.metadata}


def lost_gpu_hours(s: JobSummary) -> float | None:
    """The GPU-hours a job lost by either measure: idle SMs (waste) or the MFU gap (recoverable).

    The larger of the two, never their sum: the gap already holds the idle time (a job idle half
    its time is at most half its reference MFU). None when neither is known."""
    known = [v for v in (s.waste_gpu_hours, s.recoverable_gpu_hours) if v is not None]
    return max(known) if known else None


def sort_key(s: JobSummary) -> tuple[bool, float, float, str, str]:
    """Most GPU-hours lost first (:func:`lost_gpu_hours`: an LLM training at 100 % utilization and
    a third of its class's MFU leads, though its SMs are busy); unknown after known, then by
    GPU-hours, then name."""
    lost = lost_gpu_hours(s)
    return (lost is None, -(lost or 0.0), -(s.gpu_hours or 0.0), s.namespace, s.job)


def sorted_summaries(summaries: Sequence[JobSummary]) -> list[JobSummary]:
    return sorted(summaries, key=sort_key)
