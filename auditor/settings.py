"""The operator's settings: one typed object, from the settings file and ``GPU_AUDITOR_*`` variables.

The file is the one the Helm chart renders (docs/install.md, "The settings file"); the same keys
work from a hand-written file (``gpu-auditor run --config FILE``). Precedence, lowest first:
built-in defaults, the file, environment variables, command-line flags. Everything is validated
once at start: a typo (an unknown key) or a bad value stops the program with a message that
names the key, instead of being ignored and silently running on a default.

Secrets never sit in the file: a ``*_env`` key names the environment variable that carries the
value (the chart fills it from a Secret), resolved only when the value is used. The effective
settings are logged with every password in a URL masked (:meth:`Settings.masked`).

Environment variables: ``GPU_AUDITOR_<KEY>`` sets a top-level scalar (``GPU_AUDITOR_INTERVAL=1m``),
``GPU_AUDITOR_<SECTION>__<KEY>`` a nested one (``GPU_AUDITOR_LEADER_ELECTION__LEASE_DURATION=10s``);
lists are comma-separated (``GPU_AUDITOR_TEAM_SOURCES=podLabel:team,namespace``), the workload
classes (a list of mappings) one JSON list (``GPU_AUDITOR_MFU__CLASSES='[{"name": "llm", ...}]'``). The CLI's own
``GPU_AUDITOR_PROMETHEUS_URL`` sets ``prometheus.url``, and the chart's ``GPU_AUDITOR_DATABASE_URL``
sets the store (``store.url``, over the file's ``store.url``/``store.url_env``). Other
``GPU_AUDITOR_*`` names (secrets such as ``GPU_AUDITOR_SLACK_WEBHOOK_URL``) are only read where a
``*_env`` key names them.

Every command reads the same sources (:func:`load_cli_settings`): without ``--config`` the file
named by ``GPU_AUDITOR_CONFIG``, else the chart's ``/etc/gpu-auditor/settings.yaml`` when it
exists, so that ``report`` or ``explain`` run inside the operator's pod read the operator's store.
"""

from __future__ import annotations

import logging
import math
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Mapping

if TYPE_CHECKING:
    from auditor.core.shards import Shard

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from auditor.core.mfu import DEFAULT_CLASSES, LINEAGE_BEST, WorkloadClass
from auditor.core.rightsizing import GpuClass, RightSizingRules
from auditor.core.thresholds import ThresholdError, Thresholds
from auditor.errors import BadInput
from auditor.timeparse import parse_duration
from auditor.yamldoc import MAX_BYTES, YamlError, load_documents

log = logging.getLogger(__name__)

ENV_PREFIX = "GPU_AUDITOR_"
#: the file the Helm chart mounts (charts/gpu-auditor/templates/deployment.yaml)
DEFAULT_SETTINGS_FILE = Path("/etc/gpu-auditor/settings.yaml")
#: names the settings file when ``--config`` is not given
CONFIG_ENV = "GPU_AUDITOR_CONFIG"
#: the store URL the chart sets from its Secret (``store.postgresql.urlSecret``)
DATABASE_URL_ENV = "GPU_AUDITOR_DATABASE_URL"


#: longer than any Kubernetes object name; a cluster name is a label, not a document
MAX_CLUSTER_NAME = 253


def check_cluster_name(text: str) -> str | None:
    """Why ``text`` is not a cluster name (empty, padded, control characters, too long), or
    None when it is one: the name is recorded on every job and selects rows in a shared store."""
    if not text.strip():
        return "a cluster name must not be empty"
    if text != text.strip():
        return "a cluster name must not start or end with white space"
    if not text.isprintable():
        return "a cluster name must not hold control characters"
    if len(text) > MAX_CLUSTER_NAME:
        return f"a cluster name is at most {MAX_CLUSTER_NAME} characters"
    return None


def _duration(value: Any) -> timedelta:
    """``5m``-style text (the chart's format), a number of seconds, or a timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m, 1h")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value <= 0:
            raise ValueError("duration must be a positive number of seconds")
        return timedelta(seconds=float(value))
    if isinstance(value, str):
        try:
            return parse_duration(value, what="duration")
        except BadInput as exc:
            raise ValueError(str(exc).removeprefix("duration: ")) from None
    raise ValueError("expected a duration such as 30s, 5m, 1h")


Duration = Annotated[timedelta, BeforeValidator(_duration)]


def _thresholds(value: Any) -> Thresholds:
    """The ``thresholds:`` section, checked by the core's own rules (units, ranges, ordered pairs:
    :meth:`Thresholds.from_mapping`), so the settings file and the library cannot disagree."""
    if isinstance(value, Thresholds):
        return value
    try:
        return Thresholds.from_mapping(value)
    except ThresholdError as exc:
        raise PydanticCustomError("threshold", "{reason}", {"key": exc.key, "reason": exc.reason}) from None


ThresholdSection = Annotated[Thresholds, PlainValidator(_thresholds), PlainSerializer(Thresholds.as_dict)]


class _Section(BaseModel):
    """Unknown keys are errors (``extra='forbid'``): a typo must not be a silent default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class KubernetesSettings(_Section):
    in_cluster: bool = False
    kubeconfig: str | None = None
    context: str | None = None
    #: Act as this user (``system:serviceaccount:NS:NAME``) — for testing least privilege.
    impersonate: str | None = None


class PrometheusSettings(_Section):
    url: str | None = None
    label_convention: Literal["auto", "pod", "exported_pod", "pod_name"] = "auto"
    timeout: Duration = timedelta(seconds=60)
    tls_verify: bool = True
    ca_file: str | None = None
    retries: int = Field(default=2, ge=0, le=10)
    #: extra label matchers on every DCGM series (the CLI's ``--match``)
    matchers: dict[str, str] = Field(default_factory=dict)
    #: the tenant of a multi-tenant engine (Mimir, Cortex, Thanos Receive), sent as ``X-Scope-OrgID``
    tenant: str | None = None
    bearer_token_env: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    #: bounds on one read (docs/scale.md, "Bounds"): the series of one answer, of one cycle's (or
    #: audit's) read, the memory its statistics take, and one answer's whole time (None: timeout + 30 s)
    max_series_per_answer: int = Field(default=50_000, ge=1)
    max_series_per_cycle: int = Field(default=500_000, ge=1)
    max_read_memory_mb: int = Field(default=2048, ge=1)
    answer_deadline: Duration | None = None


class RetentionSettings(_Section):
    """What the operator prunes hourly (``gpu-auditor store prune``); docs/store.md, "Retention"."""

    #: the bucket rollup (and the aggregates of jobs that ended)
    buckets: Duration = timedelta(days=35)
    #: everything kept per job: summaries, jobs, audit runs, decisions and actions, report deliveries
    summaries: Duration = timedelta(days=400)


class StoreSettings(_Section):
    url: str | None = None
    url_env: str | None = None
    retention: RetentionSettings = Field(default_factory=RetentionSettings)

    @model_validator(mode="after")
    def _one_url(self) -> "StoreSettings":
        if self.url and self.url_env:
            raise ValueError("give store.url or store.url_env, not both")
        return self


class PoliciesSettings(_Section):
    #: load the policies shipped with gpu-auditor (policies/ in the repo, /usr/share/gpu-auditor/policies in the image)
    builtin: bool = True
    #: a directory of extra policy files (the chart mounts its policies ConfigMap here), re-read every cycle
    dir: str | None = None
    #: where the shipped policies are, when not in one of the usual places
    builtin_dir: str | None = None


class RequeueSettings(_Section):
    """Where requeue may act (``features.requeue`` turns it on at all); policies must also ask for it."""

    namespaces: list[str] = Field(default_factory=list)
    queues: list[str] = Field(default_factory=list)
    #: requeues per hour, cluster-wide
    max_per_hour: int = Field(default=5, ge=0)


class LeaderElectionSettings(_Section):
    enabled: bool = True
    #: None: $POD_NAMESPACE, in a pod its own namespace, else the kubeconfig context's (kube.lease.lease_namespace)
    namespace: str | None = None
    lease_name: str = "gpu-auditor"
    lease_duration: Duration = timedelta(seconds=15)
    renew_deadline: Duration = timedelta(seconds=10)
    retry_period: Duration = timedelta(seconds=2)
    identity: str | None = None  # None: POD_NAME, else hostname_pid

    @model_validator(mode="after")
    def _ordered(self) -> "LeaderElectionSettings":
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        return self


class ShardingSettings(_Section):
    """Which share of the cluster this operator audits (docs/scale.md, "Shards")."""

    #: this shard, 0-based; None: the ordinal of $POD_NAME (a StatefulSet pod), else 0
    shard: int | None = Field(default=None, ge=0)
    total_shards: int = Field(default=1, ge=1, le=1024)

    def resolve(self, pod_name: str | None) -> Shard:
        """The shard: ``shard`` when given, else the StatefulSet ordinal in ``pod_name``."""
        from auditor.core.shards import Shard, ordinal_of

        index = self.shard
        if index is None:
            index = ordinal_of(pod_name or "") if self.total_shards > 1 else 0
            if index is None:
                raise ValueError(
                    f"sharding.total_shards is {self.total_shards} but no sharding.shard, and the pod name "
                    f"{pod_name!r} has no StatefulSet ordinal"
                )
        if index >= self.total_shards:
            raise ValueError(f"sharding.shard {index} is not below sharding.total_shards {self.total_shards}")
        return Shard(index, self.total_shards)


class FeaturesSettings(_Section):
    annotate: bool = True
    events: bool = True
    kueue: bool = True
    requeue: bool = False


class SlackSettings(_Section):
    webhook_url_env: str | None = None


class WebhookSettings(_Section):
    url_env: str | None = None
    hmac_key_env: str | None = None


class RouteSettings(_Section):
    slack_webhook_url_env: str | None = None
    webhook_url_env: str | None = None


class NotificationsSettings(_Section):
    """Where alerts and reports go, and how hard to try (docs/policies.md, "Delivery")."""

    slack: SlackSettings = Field(default_factory=SlackSettings)
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    routes: dict[str, RouteSettings] = Field(default_factory=dict)
    #: one try's wait for an answer
    timeout: Duration = timedelta(seconds=10)
    #: all tries of one delivery end within this (a command's alerts, each weekly report)
    deadline: Duration = timedelta(seconds=30)
    #: the operator's alert queue: how often it is sent, how long an alert is retried, how many wait
    delivery_interval: Duration = timedelta(seconds=10)
    queue_deadline: Duration = timedelta(hours=1)
    queue_limit: int = Field(default=1000, ge=1)

    @model_validator(mode="after")
    def _positive(self) -> "NotificationsSettings":
        for name in ("timeout", "deadline", "delivery_interval", "queue_deadline"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"notifications.{name} must be positive")
        return self


class ReportsSettings(_Section):
    #: when the weekly reports go out: a crontab line or "mon 08:00", in ``timezone``
    weekly_schedule: str = "0 8 * * 1"
    timezone: str = "UTC"
    #: price per GPU-hour by GPU model (``modelName``), key ``default`` for the rest
    prices: dict[str, float] = Field(default_factory=dict)
    currency: str = "USD"
    #: jobs listed by waste in each team's report
    top_n: int = Field(default=10, ge=1, le=1000)
    #: teams that always get a report, even an empty one
    teams: list[str] = Field(default_factory=list)


class GateSettings(_Section):
    """The efficiency gate (docs/gate.md): the AdmissionCheck controller the operator runs on the
    leader. ``mode`` observe (the default) decides and says what enforce would do, always
    admitting; ``timeout`` bounds one decision (the Workload holds quota meanwhile); past it, or
    with the store unreadable, the job is admitted with a message unless ``fail_closed``."""

    enabled: bool = False
    mode: Literal["observe", "enforce"] = "observe"
    timeout: Duration = timedelta(seconds=2)
    fail_closed: bool = False
    #: the WorkloadPriorityClass that probation re-submissions get (rules may name another)
    probation_priority_class: str = "gpu-auditor-probation"
    #: the GateHolds object (gpu-auditor.io/v1alpha1) that the chart's MutatingAdmissionPolicy reads (hold before quota);
    #: no namespace: that path is off and holds go through the check's Rejected path alone
    holds_namespace: str | None = None
    holds_name: str = "gpu-auditor-holds"
    #: how often held jobs are looked at again (acknowledged ones are released)
    sweep_interval: Duration = timedelta(seconds=10)
    #: the HMAC-SHA256 key of signed acknowledgement links (a mounted Secret's file); unset: alerts
    #: carry no link and the operator's /gate/ack endpoint refuses every link (docs/policies.md)
    ack_link_key_file: str | None = None
    #: where users reach the operator's HTTP server (e.g. https://gpu-auditor.example.com): the
    #: links in alerts are ``<this>/gate/ack?...``; unset: alerts carry no link
    ack_link_base_url: str | None = None
    #: how long a signed link stays valid after the alert that carried it
    ack_link_ttl: Duration = timedelta(days=7)
    #: how long an acknowledgement made through a link lasts (null: no end; new flagged runs
    #: after it count again either way)
    ack_link_until: Duration | None = timedelta(days=30)
    #: how long an alert's "Snooze this job's escalation" link pauses the job's policy ladder, from
    #: the click (issue 30); at most 7 days: a longer pause is an exemption, the admin's call
    ack_link_snooze: Duration = Field(default=timedelta(hours=24), gt=timedelta(0), le=timedelta(days=7))


class HttpSettings(_Section):
    port: int = Field(default=8080, ge=0, le=65535)  # 0: any free port (tests)
    host: str = "0.0.0.0"


class ConsoleSettings(_Section):
    """The web console on the operator's HTTP server (docs/console.md)."""

    #: serve the pages under ``/console/``
    enabled: bool = True
    #: offer acknowledging and snoozing from the job page (recorded like ``gpu-auditor ack``)
    writes: bool = False


def _classes_text(value: Any) -> Any:
    """``mfu.classes`` from a variable (``GPU_AUDITOR_MFU__CLASSES``): a JSON list of classes,
    the one way a list of mappings fits in one environment variable."""
    if isinstance(value, str):
        import json

        try:
            return json.loads(value)
        except ValueError as exc:
            raise ValueError(f"expected a JSON list of classes ({exc})") from None
    return value


class MfuClassSettings(_Section):
    """One workload class (:class:`auditor.core.mfu.WorkloadClass`): which jobs it holds (every
    non-empty selector must match; fnmatch globs) and the MFU such jobs reach (null: none, the
    class is never charged recoverable GPU-hours nor called ``low_mfu``)."""

    name: str = Field(min_length=1, max_length=63)
    reference_mfu: float | None = None
    #: an inference server: its idle time between requests is a serving question (issue 28)
    serving: bool = False
    namespaces: list[str] = Field(default_factory=list)
    teams: list[str] = Field(default_factory=list)
    #: label key → value glob, every one on the job (``gpu-auditor.io/workload-class: llm-training``)
    labels: dict[str, str] = Field(default_factory=dict)
    priority_classes: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value != value.strip() or not value.isprintable():
            raise ValueError("a class name must be printable, without leading or trailing white space")
        if value == LINEAGE_BEST:
            raise ValueError(f"{LINEAGE_BEST!r} names the lineage's own best run, not a class")
        return value

    @field_validator("reference_mfu")
    @classmethod
    def _ratio(cls, value: float | None) -> float | None:
        if value is None:
            return None
        if not math.isfinite(value) or not 0.0 < value <= 1.0:
            hint = f": did you mean {value / 100:g}?" if 5.0 <= value <= 100.0 else ""  # a percentage
            raise ValueError(f"{value:g} is not an MFU: a ratio above 0 and at most 1{hint}")
        return value

    @field_validator("namespaces", "teams", "priority_classes")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        if any(not p.strip() for p in value):
            raise ValueError("an empty pattern matches nothing: leave the list out to match every job")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        if any(not k.strip() for k in value):
            raise ValueError("a label selector needs a key")
        return value

    def workload_class(self) -> WorkloadClass:
        return WorkloadClass(
            name=self.name,
            reference_mfu=self.reference_mfu,
            serving=self.serving,
            namespaces=tuple(self.namespaces),
            teams=tuple(self.teams),
            labels=tuple(sorted(self.labels.items())),
            priority_classes=tuple(self.priority_classes),
        )


class MfuSettings(_Section):
    """What a job's MFU is measured against (docs/operator.md, "MFU references"; issue 28).

    ``classes`` (first match wins) replace the shipped ones (:data:`auditor.core.mfu.DEFAULT_CLASSES`,
    selected by the job label ``gpu-auditor.io/workload-class``) when given; ``lineage_best``
    also measures a job against the best MFU of earlier runs of its lineage."""

    classes: Annotated[list[MfuClassSettings] | None, BeforeValidator(_classes_text)] = None
    lineage_best: bool = True

    @field_validator("classes")
    @classmethod
    def _unique(cls, value: list[MfuClassSettings] | None) -> list[MfuClassSettings] | None:
        names = [c.name for c in value or ()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"class name(s) given twice: {', '.join(twice)}")
        return value

    def workload_classes(self) -> tuple[WorkloadClass, ...]:
        """The classes in force: the file's, else the shipped defaults."""
        if self.classes is None:
            return DEFAULT_CLASSES
        return tuple(c.workload_class() for c in self.classes)


class GpuClassSettings(_Section):
    """A smaller GPU class right-sizing may advise (docs/rightsizing.md): its memory in GiB, its
    compute (and memory bandwidth, default the same) relative to the models in ``instead_of``."""

    name: str = Field(min_length=1)
    memory_gib: float = Field(gt=0)
    relative_compute: float = Field(gt=0, le=1)
    relative_bandwidth: float | None = Field(default=None, gt=0, le=1)
    price_per_gpu_hour: float | None = Field(default=None, ge=0)
    instead_of: list[str] = Field(min_length=1)


class RightsizingSettings(_Section):
    """Right-sizing advice (issue 32; docs/rightsizing.md): the headroom a slice must leave above
    a job's peaks, and how long and how completely a job must have been seen to be judged."""

    enabled: bool = True
    memory_headroom: float = Field(default=0.20, ge=0, lt=1)
    compute_headroom: float = Field(default=0.20, ge=0, lt=1)
    min_span: Duration = timedelta(hours=1)
    min_coverage: float = Field(default=0.80, ge=0, le=1)
    gpu_classes: list[GpuClassSettings] = Field(default_factory=list)

    def rules(self) -> RightSizingRules:
        return RightSizingRules(
            memory_headroom=self.memory_headroom,
            compute_headroom=self.compute_headroom,
            min_span=self.min_span,
            min_coverage=self.min_coverage,
            gpu_classes=tuple(
                GpuClass(
                    c.name,
                    c.memory_gib * 1024,
                    c.relative_compute,
                    c.price_per_gpu_hour,
                    tuple(c.instead_of),
                    c.relative_bandwidth,
                )
                for c in self.gpu_classes
            ),
        )


_TEAM_SOURCE = re.compile(
    r"^(podLabel|jobLabel|namespaceLabel):[A-Za-z0-9._/-]+$|^(kueueQueue|kueueLocalQueue|kueueClusterQueue|namespace)$"
)


class Settings(_Section):
    """Everything ``gpu-auditor run`` needs; see docs/operator.md for each key."""

    cluster: str = "default"
    #: ``audit``: the policies decide, record and show (console, status, report) what they would
    #: do, and nothing is written to users' objects or sent to users (docs/install.md, "A quiet
    #: start"); ``enforce``: each policy's own mode applies. The chart's default is ``audit``.
    mode: Literal["audit", "enforce"] = "enforce"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    #: time between audit cycles
    interval: Duration = timedelta(minutes=5)
    bucket_width: Duration = timedelta(minutes=5)
    #: how far back a job seen for the first time (or the first cycle ever) is read
    max_lookback: Duration = timedelta(days=7)
    #: a catch-up after an outage is read in pieces of at most this length
    catch_up_chunk: Duration = timedelta(hours=6)
    #: the longest range one ``audit`` (or ``doctor --lookback``) reads: a read keeps one value per
    #: bucket of every series, so memory grows with the range's length
    max_audit_range: Duration = timedelta(days=31)
    #: pods with DCGM series that the Kubernetes API no longer knows: ``pod`` audits each as its
    #: own job ``Pod/<name>`` (history is kept), ``skip`` leaves them out
    unresolved_pods: Literal["pod", "skip"] = "pod"
    #: how long a deleted pod is remembered, so that its last samples are still attributed
    deleted_pod_memory: Duration = timedelta(hours=1)
    store: StoreSettings = Field(default_factory=StoreSettings)
    policies: PoliciesSettings = Field(default_factory=PoliciesSettings)
    requeue: RequeueSettings = Field(default_factory=RequeueSettings)
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings)
    sharding: ShardingSettings = Field(default_factory=ShardingSettings)
    features: FeaturesSettings = Field(default_factory=FeaturesSettings)
    team_sources: list[str] = Field(
        default_factory=lambda: ["podLabel:team", "jobLabel:team", "namespaceLabel:team", "kueueQueue", "namespace"]
    )
    notifications: NotificationsSettings = Field(default_factory=NotificationsSettings)
    reports: ReportsSettings = Field(default_factory=ReportsSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    gate: GateSettings = Field(default_factory=GateSettings)
    #: the verdict thresholds (auditor/core/thresholds.py, docs/verdicts.md "Tuning")
    thresholds: ThresholdSection = Field(default_factory=Thresholds)
    #: workload classes and their reference MFUs, the lineage-best reference (issue 28)
    mfu: MfuSettings = Field(default_factory=MfuSettings)
    #: right-sizing advice: headroom, minimum span and coverage, smaller GPU classes (issue 32)
    rightsizing: RightsizingSettings = Field(default_factory=RightsizingSettings)

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str) -> str:
        why = check_cluster_name(value)
        if why is not None:
            raise ValueError(why)
        return value

    @field_validator("team_sources")
    @classmethod
    def _team_sources(cls, value: list[str]) -> list[str]:
        for item in value:
            if not _TEAM_SOURCE.match(item):
                raise ValueError(
                    f"{item!r} is not a team source (use podLabel:KEY, jobLabel:KEY, namespaceLabel:KEY, "
                    "kueueQueue, kueueLocalQueue, kueueClusterQueue or namespace)"
                )
        if not value:
            raise ValueError("at least one team source is needed (e.g. namespace)")
        return value

    @model_validator(mode="after")
    def _widths(self) -> "Settings":
        if self.bucket_width < timedelta(seconds=1):
            raise ValueError("bucket_width must be at least 1s")
        if self.catch_up_chunk < self.bucket_width:
            raise ValueError("catch_up_chunk must be at least one bucket_width")
        return self

    # ------------------------------------------------------------------ use

    def database_url(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The store URL, from ``store.url`` or the variable ``store.url_env`` names (None: default SQLite)."""
        env = os.environ if environ is None else environ
        if self.store.url_env:
            value = env.get(self.store.url_env)
            if not value:
                raise BadInput(f"store.url_env: environment variable {self.store.url_env} is not set")
            return value
        return self.store.url

    def secret(self, env_name: str | None, key: str, environ: Mapping[str, str] | None = None) -> str | None:
        """The value of the variable a ``*_env`` key names (``key`` for the error message)."""
        if not env_name:
            return None
        env = os.environ if environ is None else environ
        value = env.get(env_name)
        if value is None:
            raise BadInput(f"{key}: environment variable {env_name} is not set")
        return value

    def masked(self) -> dict[str, Any]:
        """The effective settings as plain data, passwords in URLs masked (for the log)."""
        from auditor.redact import mask_url

        data = self.model_dump(mode="python")

        def walk(node: Any) -> Any:
            if isinstance(node, timedelta):
                secs = node.total_seconds()
                for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
                    if secs >= n and secs % n == 0:
                        return f"{int(secs // n)}{unit}"
                return f"{secs:g}s"
            if isinstance(node, dict):
                return {k: walk(v) for k, v in node.items()}
            if isinstance(node, list):
                return [walk(v) for v in node]
            if isinstance(node, str) and "://" in node:
                return mask_url(node)
            return node

        return walk(data)


# ---------------------------------------------------------------------- loading


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """``GPU_AUDITOR_*`` variables that are settings, as a nested dict (strings; pydantic converts)."""
    out: dict[str, Any] = {}
    top_scalars = {name for name, f in Settings.model_fields.items() if f.default_factory is None}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        if name == "GPU_AUDITOR_PROMETHEUS_URL":
            out.setdefault("prometheus", {})["url"] = value
            continue
        if name == DATABASE_URL_ENV:
            if value.strip():  # an empty variable (a Secret without the key) is no setting
                out.setdefault("store", {}).update(url=value, url_env=None)
            continue
        if "__" in rest:
            path = rest.split("__")
            node = out
            for part in path[:-1]:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise BadInput(f"environment variable {name}: {part} is not a section")
            node[path[-1]] = value
        elif rest == "team_sources":
            out["team_sources"] = [s.strip() for s in value.split(",") if s.strip()]
        elif rest in top_scalars:
            out[rest] = value
        # anything else (secrets named by *_env keys, the CLI's own variables) is not a setting
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _env_name(loc: tuple) -> str:
    # a list's items come from the one variable that holds the list (GPU_AUDITOR_MFU__CLASSES)
    ints = [i for i, p in enumerate(loc) if isinstance(p, int)]
    parts = [str(p) for p in (loc[: ints[0]] if ints else loc)]
    if parts == ["prometheus", "url"]:
        return "GPU_AUDITOR_PROMETHEUS_URL"
    if parts[:1] == ["store"] and parts[-1:] in (["url"], ["url_env"]):
        return DATABASE_URL_ENV
    return ENV_PREFIX + "__".join(p.upper() for p in parts)


def _describe(exc: ValidationError, origin: str, env: bool = False) -> str:
    """pydantic's errors as one line per key: ``settings.yaml: leader_election.lease_durration:
    unknown key``."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        if err["type"] == "threshold" and err["ctx"]["key"]:  # the key inside the section
            loc += tuple(err["ctx"]["key"].split("."))
        key = ".".join(str(p) for p in loc) or "(top level)"
        if env:
            key = f"{key} (variable {_env_name(loc)})"
        if err["type"] == "extra_forbidden":
            parent = ".".join(str(p) for p in err["loc"][:-1])
            lines.append(f"{origin}: unknown key {key}" + (f" in section {parent!r}" if parent else ""))
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{origin}: {key}: {msg}")
    return "; ".join(lines)


def load_settings(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Defaults ← the YAML file at ``path`` ← ``GPU_AUDITOR_*`` variables ← ``overrides`` (flags).

    Raises :class:`BadInput` naming the file and the key for anything unknown or invalid.
    """
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    origin = "settings"
    if path is not None:
        origin = str(path)
        try:
            size = Path(path).stat().st_size
            if size > MAX_BYTES:
                raise BadInput(f"settings file {path}: {size:,} bytes, more than the {MAX_BYTES:,} it may have")
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"settings file {path}: cannot read ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise BadInput(f"settings file {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        try:
            docs = load_documents(text, str(path))
        except YamlError as exc:
            raise BadInput(f"settings file {path}:{exc.line}: not valid YAML: {exc}") from None
        if len(docs) > 1:
            raise BadInput(f"settings file {path}:{docs[1].line}: one YAML document expected, found a second")
        loaded = docs[0].value if docs else None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise BadInput(
                f"settings file {path}: the top level must be a mapping of keys, got {type(loaded).__name__}"
            )
        data = loaded
    try:
        Settings.model_validate(data)  # the file alone first: its errors name the file
    except ValidationError as exc:
        raise BadInput(_describe(exc, origin)) from None
    merged = _merge(data, _env_overrides(env))
    try:
        Settings.model_validate(merged)
    except ValidationError as exc:
        raise BadInput(_describe(exc, "environment", env=True)) from None
    if overrides:
        merged = _merge(merged, overrides)
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        raise BadInput(_describe(exc, "command line")) from None


def settings_file(config: str | Path | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The settings file a command reads: ``--config``, else ``$GPU_AUDITOR_CONFIG``, else the
    chart's :data:`DEFAULT_SETTINGS_FILE` when it exists (None: defaults and variables only).

    The default file is what makes a command typed in the operator's pod (``kubectl exec``) use
    the operator's store and settings without flags.
    """
    env = os.environ if environ is None else environ
    if config:
        return Path(config)
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV])
    return DEFAULT_SETTINGS_FILE if DEFAULT_SETTINGS_FILE.is_file() else None


def load_cli_settings(
    config: str | Path | None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """:func:`load_settings` over :func:`settings_file`: the one way every command (``run``,
    ``report``, ``explain``, ``policy simulate``, ...) finds its settings."""
    return load_settings(settings_file(config, environ), environ=environ, overrides=overrides)


def log_effective(settings: Settings, logger: logging.Logger = log) -> None:
    """Log the effective settings once at start (passwords masked)."""
    import json

    logger.info("effective settings: %s", json.dumps(settings.masked(), sort_keys=True))
