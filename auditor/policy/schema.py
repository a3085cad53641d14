"""The policy schema: Kubernetes-shaped documents validated with pydantic (unknown keys rejected).

A policy file holds one or more documents::

    apiVersion: gpu-auditor.io/v1alpha1
    kind: GpuPolicy
    metadata: {name: high-util-low-sm}
    spec:
      mode: warn                       # audit | warn | enforce
      verdicts: [low_sm_efficiency]    # fire only on these summary verdicts (optional)
      selector: {...}                  # which jobs (namespaces, teams, queues, labels, GPU models)
      conditions: [...]                # on the job summary: {field, op, value}
      gpus: {atLeast: 1, share: 0.5}   # judge a multi-GPU job GPU by GPU: enough of its GPUs must meet them
      sustained: {...}                 # on the stored buckets: held for a duration after a warm-up
      lineage: {belowBest: 0.8}        # on the lineage's history: MFU below 0.8 x its best earlier run
      rightsizing: {minGpuHoursFreed: 1}  # a smaller MIG slice would hold it (docs/rightsizing.md)
      exemptions: {...}
      escalation: [...]                # ordered steps of actions with cooldowns
      requeue: {...}
      advice: text

docs/policies.md is the user-facing reference; field names here are the contract.
"""

from __future__ import annotations

import fnmatch
import re
from datetime import timedelta
from enum import Enum
from types import MappingProxyType
from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from auditor.core.gate import GateAction, GateRule
from auditor.core.job_summary import MEAN_FIELDS, policy_fields
from auditor.core.ranges import RATIO, Range
from auditor.core.rightsizing import RightSizingRules
from auditor.timeparse import parse_duration

API_VERSION = "gpu-auditor.io/v1alpha1"
KIND = "GpuPolicy"
ANNOTATION_PREFIX = "gpu-auditor.io/"
EXEMPT_ANNOTATION = "gpu-auditor.io/exempt"
SNOOZE_ANNOTATION = "gpu-auditor.io/snooze-until"

#: Summary fields a condition may test (audit JSON, DESIGN.md), each with its unit and range: a
#: value outside it can never (or always) match, so it is refused (``value: 90`` for a ratio).
#: Declared with the fields of :class:`auditor.core.job_summary.JobSummary`, not here.
SUMMARY_FIELDS: Mapping[str, Range] = MappingProxyType(policy_fields())
#: Fields a sustained condition may test: means per bucket, computed from the stored rollup.
SUSTAINED_FIELDS = frozenset(
    {
        "gpu_util",
        "gr_engine_active",
        "sm_active",
        "sm_occupancy",
        "tensor_active",
        "dram_active",
        "fp32_active",
        "fp16_active",
        "power_w",
    }
)
#: Summary fields each GPU of a job has too (its row of ``per_gpu``): under ``gpus`` a condition on
#: one of them is tested on every GPU; the others (GPU-hours, waste, MFU gap, ...) are the job's.
PER_GPU_FIELDS = frozenset({name for name, _ in MEAN_FIELDS} | {"coverage", "mfu_estimate"}) & SUMMARY_FIELDS.keys()
VERDICTS = frozenset(
    {"idle", "underutilized", "low_sm_efficiency", "memory_bound", "no_tensor_cores", "low_mfu", "healthy"}
)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _duration(v: Any) -> timedelta:
    if isinstance(v, timedelta):
        return v
    if isinstance(v, bool):
        raise ValueError("a duration is text like 30m, 1h, 90s")
    if isinstance(v, (int, float)):
        if v < 0:
            raise ValueError("a duration cannot be negative")
        return timedelta(seconds=v)
    if isinstance(v, str):
        if v.strip() in ("0", "0s", "0m"):
            return timedelta(0)
        try:
            return parse_duration(v, what="duration")
        except Exception as exc:  # BadInput → a pydantic error with the field's location
            raise ValueError(str(exc).removeprefix("duration: ")) from exc
    raise ValueError("a duration is text like 30m, 1h, 90s")


Duration = Annotated[timedelta, BeforeValidator(_duration)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Mode(str, Enum):
    """``audit`` records decisions only; ``warn`` annotates, records Events and alerts;
    ``enforce`` may also requeue (where requeue is enabled)."""

    AUDIT = "audit"
    WARN = "warn"
    ENFORCE = "enforce"


class ActionKind(str, Enum):
    ANNOTATE = "annotate"
    EVENT = "event"
    NOTIFY = "notify"  # Slack and/or webhook, routed by team
    REQUEUE = "requeue"


class Condition(_Strict):
    """``field op value``: true only when the field is present (missing data never matches)."""

    field: str
    op: Literal["<", "<=", ">", ">=", "==", "!="]
    value: float

    @field_validator("value")
    @classmethod
    def _in_range(cls, v: float, info: ValidationInfo) -> float:
        name = info.data.get("field")  # absent when the field itself was refused
        unit = SUMMARY_FIELDS.get(name) if isinstance(name, str) else None
        problem = unit.problem(v) if unit is not None else None
        if problem:
            raise ValueError(f"{name}: {problem}")
        return v

    def holds(self, actual: float | None) -> bool:
        if actual is None or actual != actual:
            return False
        return {
            "<": actual < self.value,
            "<=": actual <= self.value,
            ">": actual > self.value,
            ">=": actual >= self.value,
            "==": actual == self.value,
            "!=": actual != self.value,
        }[self.op]

    def describe(self) -> str:
        return f"{self.field} {self.op} {self.value:g}"


class SummaryCondition(Condition):
    @field_validator("field")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in SUMMARY_FIELDS:
            raise ValueError(f"unknown summary field {v!r} (one of {', '.join(sorted(SUMMARY_FIELDS))})")
        return v


class SustainedCondition(Condition):
    @field_validator("field")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in SUSTAINED_FIELDS:
            raise ValueError(f"unknown sustained field {v!r} (one of {', '.join(sorted(SUSTAINED_FIELDS))})")
        return v


class Sustained(_Strict):
    """All ``conditions`` hold in every covered bucket of the last ``for`` (after ``warmup``
    from the job's first bucket), and covered buckets are at least ``minCoverage`` of them."""

    duration: Duration = Field(alias="for")
    warmup: Duration = timedelta(minutes=10)
    min_coverage: float = Field(0.8, alias="minCoverage")
    conditions: list[SustainedCondition] = Field(min_length=1)

    @field_validator("min_coverage")
    @classmethod
    def _coverage(cls, v: float) -> float:
        problem = RATIO.problem(v)
        if problem or v == 0:
            raise ValueError(problem or "must be above 0 (a window without data never holds)")
        return v

    @field_validator("duration")
    @classmethod
    def _positive(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("must be positive")
        return v


class LineageCondition(_Strict):
    """A condition on the job's lineage's own history (issue 28): the job's MFU estimate is below
    ``belowBest`` × the best MFU of the lineage's earlier runs ("below its own best run"). A job
    without an MFU estimate is not judged; a lineage without an earlier run with one never fires."""

    below_best: float = Field(alias="belowBest", gt=0.0, le=1.0)

    def describe(self) -> str:
        return f"mfu_estimate < {self.below_best:g} x its lineage's best earlier run"


class RightsizingCondition(_Strict):
    """``rightsizing``: the job would fit a smaller MIG slice of its GPU (issue 32;
    docs/rightsizing.md) and moving it would free at least ``minGpuHoursFreed`` GPU-hours.
    Judged with the headroom given here (the defaults are the settings'), on MIG profiles only:
    GPU classes and prices are the operator's settings, not a policy's."""

    min_gpu_hours_freed: float = Field(0.0, alias="minGpuHoursFreed", ge=0.0)
    memory_headroom: float = Field(0.20, alias="memoryHeadroom", ge=0.0, lt=1.0)
    compute_headroom: float = Field(0.20, alias="computeHeadroom", ge=0.0, lt=1.0)

    def rules(self) -> RightSizingRules:
        return RightSizingRules(memory_headroom=self.memory_headroom, compute_headroom=self.compute_headroom)

    def describe(self) -> str:
        return f"a smaller MIG slice would hold it and free >= {self.min_gpu_hours_freed:g} GPU-hours"


class GpuQuorum(_Strict):
    """``gpus``: judge a job GPU by GPU, as its GPUs are (issue 30). The job's average hides a
    rank that differs: three GPUs at 100 % utilization and 3 % SM activity beside a straggler
    at 12 % average 78 %, under an 0.8 floor. With ``gpus``, ``verdicts``, the conditions on
    :data:`PER_GPU_FIELDS` and ``sustained`` are tested on each GPU (its own verdict, figures
    and buckets), and the policy fires when at least ``atLeast`` GPUs meet them all and they
    hold at least ``share`` of the job's GPU-hours (a GPU-hour weighting, so that a GPU that
    joined late or a small MIG slice weighs what it cost)."""

    at_least: int = Field(1, alias="atLeast", ge=1, le=4096)
    share: float = Field(0.0, ge=0.0, le=1.0)

    def describe(self) -> str:
        parts = [f"at least {self.at_least} GPU{'' if self.at_least == 1 else 's'}"]
        if self.share:
            parts.append(f"{self.share:.0%} of its GPU-hours")
        return " and ".join(parts)


class Selector(_Strict):
    """Which jobs a policy looks at. Empty lists mean "any". Names allow shell globs (``ml-*``).
    Every listed criterion must match; an unknown value (e.g. labels without Kubernetes) never matches."""

    namespaces: list[str] = []
    exclude_namespaces: list[str] = Field([], alias="excludeNamespaces")
    teams: list[str] = []
    queues: list[str] = []
    kinds: list[str] = []
    gpu_models: list[str] = Field([], alias="gpuModels")
    labels: dict[str, str] = {}
    min_gpus: float = Field(0.0, alias="minGpus", ge=0.0)


class Exemptions(_Strict):
    """Jobs left alone. ``annotation`` on the job or its namespace opts out: value ``true`` or an
    RFC 3339 expiry time (exempt until then); ``policies`` lists the policies the opt-out covers
    when the annotation value is ``policy-a,policy-b`` instead."""

    annotation: str = EXEMPT_ANNOTATION
    namespaces: list[str] = []
    teams: list[str] = []
    jobs: list[str] = []  # "namespace/Kind/name" globs

    @field_validator("annotation")
    @classmethod
    def _prefixed(cls, v: str) -> str:
        if not v.startswith(ANNOTATION_PREFIX):
            raise ValueError(f"the opt-out annotation must be under {ANNOTATION_PREFIX}")
        return v


class Step(_Strict):
    """One escalation step. It runs when the violation has lasted ``after`` (since it opened) and
    ``cooldown`` has passed since the previous step ran."""

    actions: list[ActionKind] = Field(min_length=1)
    after: Duration = timedelta(0)
    cooldown: Duration = timedelta(0)
    note: str = ""


class Requeue(_Strict):
    """How a requeue step behaves (it also needs mode ``enforce`` and the operator's requeue
    settings: off by default, enabled per namespace or queue, rate-limited cluster-wide)."""

    backoff: Duration = timedelta(minutes=10)
    max_per_job: int = Field(1, alias="maxPerJob", ge=1, le=10)
    lower_priority_by: int = Field(0, alias="lowerPriorityBy", ge=0)


class Spec(_Strict):
    description: str = ""
    mode: Mode = Mode.AUDIT
    verdicts: list[str] = []
    selector: Selector = Selector()
    conditions: list[SummaryCondition] = []
    sustained: Sustained | None = None
    lineage: LineageCondition | None = None
    rightsizing: RightsizingCondition | None = None
    #: after what it judges per GPU, so that its check reads them (and its error names its line)
    gpus: GpuQuorum | None = None
    exemptions: Exemptions = Exemptions()
    escalation: list[Step] = Field(min_length=1)
    requeue: Requeue = Requeue()
    advice: str = ""

    @field_validator("verdicts")
    @classmethod
    def _verdicts(cls, v: list[str]) -> list[str]:
        for x in v:
            if x not in VERDICTS:
                raise ValueError(
                    f"unknown verdict {x!r} (one of {', '.join(sorted(VERDICTS))}; insufficient_data never fires)"
                )
        return v

    @field_validator("gpus")
    @classmethod
    def _per_gpu(cls, v: GpuQuorum | None, info: ValidationInfo) -> GpuQuorum | None:
        d = info.data
        if v is None or not {"verdicts", "conditions", "sustained"} <= d.keys():
            return v  # one of them is refused already: that error is the one to read
        if not d["verdicts"] and d["sustained"] is None:
            if not any(c.field in PER_GPU_FIELDS for c in d["conditions"]):
                raise ValueError(
                    "gpus judges each GPU by verdicts, sustained or conditions on "
                    f"{', '.join(sorted(PER_GPU_FIELDS))}: this policy has none of them"
                )
        return v

    @model_validator(mode="after")
    def _sane(self) -> "Spec":
        if (
            not self.verdicts
            and not self.conditions
            and self.sustained is None
            and self.lineage is None
            and self.rightsizing is None
        ):
            raise ValueError("a policy needs at least one of verdicts, conditions, sustained, lineage or rightsizing")
        seen_notice = False
        for step in self.escalation:
            if ActionKind.REQUEUE in step.actions and not seen_notice:
                raise ValueError("requeue must come after a step that tells the user (event or notify)")
            if ActionKind.EVENT in step.actions or ActionKind.NOTIFY in step.actions:
                seen_notice = True
        return self


class Metadata(_Strict):
    name: str
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}

    @field_validator("name")
    @classmethod
    def _dns(cls, v: str) -> str:
        if not _NAME.match(v) or len(v) > 63:
            raise ValueError("name must be a DNS label: lower-case letters, digits and '-', at most 63")
        return v


class Policy(_Strict):
    api_version: Literal["gpu-auditor.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GpuPolicy"]
    metadata: Metadata
    spec: Spec

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def mode(self) -> Mode:
        return self.spec.mode


def glob_any(value: str | None, patterns: list[str]) -> bool:
    """True when ``value`` matches one of ``patterns`` (shell globs); None never matches."""
    return value is not None and any(fnmatch.fnmatchcase(value, p) for p in patterns)


# ---------------------------------------------------------------------- gate rules

GATE_KIND = "GatePolicy"
_FINDING_CODE = re.compile(r"^[a-z][a-z0-9_]*$")
#: a Kubernetes object name (a WorkloadPriorityClass): DNS subdomain
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class GateVerb(str, Enum):
    """What a gate rule does to a re-submission: ``hold`` it until acknowledged, or admit it at
    the probation priority (``deprioritize``)."""

    HOLD = "hold"
    DEPRIORITIZE = "deprioritize"


class GateSelector(_Strict):
    """Which lineages a gate rule looks at (globs; empty means any). The admission path knows a
    lineage's namespace and its team from history, not labels or GPU models."""

    namespaces: list[str] = []
    exclude_namespaces: list[str] = Field([], alias="excludeNamespaces")
    teams: list[str] = []


class GateSpec(_Strict):
    """A gate rule: fires when at least ``atLeast`` of the last ``ofLast`` judged runs of the
    lineage (started within ``within``, when set) are flagged by ``verdicts`` or ``findings``."""

    description: str = ""
    action: GateVerb
    verdicts: list[str] = []
    findings: list[str] = []
    at_least: int = Field(1, alias="atLeast", ge=1, le=100)
    of_last: int | None = Field(None, alias="ofLast", ge=1, le=100)
    within: Duration | None = None
    priority_class: str | None = Field(None, alias="priorityClass")
    selector: GateSelector = GateSelector()
    advice: str = ""

    @field_validator("verdicts")
    @classmethod
    def _verdicts(cls, v: list[str]) -> list[str]:
        for x in v:
            if x not in VERDICTS or x == "healthy":
                raise ValueError(
                    f"unknown verdict {x!r} (one of {', '.join(sorted(VERDICTS - {'healthy'}))}; "
                    "insufficient_data never counts, healthy never flags)"
                )
        return v

    @field_validator("findings")
    @classmethod
    def _codes(cls, v: list[str]) -> list[str]:
        for x in v:
            if not _FINDING_CODE.match(x):
                raise ValueError(f"{x!r} is not a finding code (docs/findings.md: e.g. collective_wait_straggler)")
        return v

    @field_validator("within")
    @classmethod
    def _positive(cls, v: timedelta | None) -> timedelta | None:
        if v is not None and v <= timedelta(0):
            raise ValueError("must be positive")
        return v

    @field_validator("priority_class")
    @classmethod
    def _class_name(cls, v: str | None) -> str | None:
        if v is not None and (not _DNS_SUBDOMAIN.match(v) or len(v) > 253):
            raise ValueError("a WorkloadPriorityClass name: lower-case letters, digits, '-' and '.'")
        return v

    @model_validator(mode="after")
    def _sane(self) -> "GateSpec":
        if not self.verdicts and not self.findings:
            raise ValueError("a gate rule needs verdicts or findings: what flags a run")
        if self.of_last is not None and self.at_least > self.of_last:
            raise ValueError(f"atLeast {self.at_least} can never be reached in ofLast {self.of_last} runs")
        if self.priority_class is not None and self.action is not GateVerb.DEPRIORITIZE:
            raise ValueError("priorityClass is for action deprioritize (a hold admits nothing)")
        return self


class GatePolicy(_Strict):
    """A ``kind: GatePolicy`` document: one efficiency-gate rule, in the same files as the
    ``GpuPolicy`` documents (validated, listed and simulated with them)."""

    api_version: Literal["gpu-auditor.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GatePolicy"]
    metadata: Metadata
    spec: GateSpec

    @property
    def name(self) -> str:
        return self.metadata.name

    def rule(self) -> GateRule:
        """The core's value of this rule (:func:`auditor.core.gate.decide` reads it)."""
        s = self.spec
        return GateRule(
            name=self.name,
            action=GateAction.HOLD if s.action is GateVerb.HOLD else GateAction.DEPRIORITIZE,
            verdicts=frozenset(s.verdicts),
            findings=frozenset(s.findings),
            at_least=s.at_least,
            of_last=s.of_last,
            within=s.within,
            priority_class=s.priority_class,
            namespaces=tuple(s.selector.namespaces),
            exclude_namespaces=tuple(s.selector.exclude_namespaces),
            teams=tuple(s.selector.teams),
            description=s.description,
        )

    def describe(self) -> str:
        return f"gate: {self.spec.action.value} when {self.rule().describe()}"
