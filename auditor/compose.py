"""The composition root: the one place that turns settings into adapters.

Every CLI command and the operator build their Prometheus source, store, Kubernetes client,
resolver, cluster actions, Lease elector, report destinations and clock here, from one
:class:`~auditor.settings.Settings`
(the file, ``GPU_AUDITOR_*`` variables, then the command's flags as overrides). So a connection
option exists once: a flag that ``--help`` lists reaches every command that reads Prometheus,
because no command builds its own client (the drift this replaced: ``run`` ignored the
basic-auth flags and ``GPU_AUDITOR_PROMETHEUS_TOKEN`` that ``audit`` honoured).

Secrets are never settings values (they would be logged with the effective settings): the file
names the variables that hold them (``*_env`` keys), and a command line names files or its own
variables (:class:`PrometheusAuth`), resolved here only when the adapter is built.

Use-cases (engine, operator cycle, policy run, reports, doctor) never import this module; they
take the ports of :mod:`auditor.ports` and are handed what is built here. (Two exceptions, for
now: the policy runner makes its alert senders from the routes of its ``RunnerConfig``, and
``demo`` opens its own SQLite file.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from auditor.clock import SYSTEM_CLOCK
from auditor.errors import BadInput

if TYPE_CHECKING:  # each adapter is imported where it is built: `--help` loads none of them
    from kubernetes.client import ApiClient

    from auditor.actions.kube import KubeActions
    from auditor.console.app import ConsoleApp
    from auditor.engine import MfuPlan
    from auditor.errors import LeaseUnavailable
    from auditor.kube.lease import LeaderElector
    from auditor.kube.resolver import KubeResolver
    from auditor.operator_loop.service import Operator
    from auditor.ports import CheckRequeue, Clock
    from auditor.reports import Destinations
    from auditor.settings import Settings
    from auditor.sources.prometheus import PrometheusSource
    from auditor.sources.replay import ReplaySource
    from auditor.store import Store

#: the command line's own variables for Prometheus credentials (never settings: they are secrets)
PROMETHEUS_TOKEN_ENV = "GPU_AUDITOR_PROMETHEUS_TOKEN"
PROMETHEUS_PASSWORD_ENV = "GPU_AUDITOR_PROMETHEUS_PASSWORD"


@dataclass(frozen=True)
class PrometheusAuth:
    """Where a command's Prometheus credentials come from: files named by flags (a secret as a
    flag value would show in ``ps`` and shell history), else :data:`PROMETHEUS_TOKEN_ENV` /
    :data:`PROMETHEUS_PASSWORD_ENV`. Given at all, they replace the settings file's ``*_env``
    credentials; a command line that gives none leaves those in force."""

    token_file: str | None = None
    user: str | None = None
    password_file: str | None = None


def _read_secret(path: str, what: str) -> str:
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise BadInput(f"{what} {path}: cannot read ({exc.strerror})") from None
    if not value:
        raise BadInput(f"{what} {path}: file is empty")
    return value


def prometheus_credentials(
    settings: "Settings", auth: PrometheusAuth | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str | None, tuple[str, str] | None]:
    """``(bearer token, (user, password))`` for Prometheus, at most one of them set.

    The command line's inputs (``auth``, and its variables) win over the settings' ``*_env``
    keys; contradictions are :class:`BadInput` naming the flags, before anything is contacted.
    """
    env = os.environ if environ is None else environ
    token: str | None = None
    basic: tuple[str, str] | None = None
    if auth is not None:
        if auth.token_file:
            token = _read_secret(auth.token_file, "--prometheus-token-file")
        elif env.get(PROMETHEUS_TOKEN_ENV, "").strip():
            token = env[PROMETHEUS_TOKEN_ENV].strip()
        if auth.user:
            if auth.password_file:
                password = _read_secret(auth.password_file, "--prometheus-password-file")
            elif env.get(PROMETHEUS_PASSWORD_ENV) is not None:
                password = env[PROMETHEUS_PASSWORD_ENV]
            else:
                raise BadInput(f"--prometheus-user needs --prometheus-password-file or env {PROMETHEUS_PASSWORD_ENV}")
            basic = (auth.user, password)
        elif auth.password_file:
            raise BadInput("--prometheus-password-file needs --prometheus-user")
        if token and basic:
            raise BadInput("give a bearer token or basic auth for Prometheus, not both")
        if token or basic:
            return token, basic
    p = settings.prometheus
    token = settings.secret(p.bearer_token_env, "prometheus.bearer_token_env", env)
    if p.username_env:
        user = settings.secret(p.username_env, "prometheus.username_env", env) or ""
        basic = (user, settings.secret(p.password_env, "prometheus.password_env", env) or "")
    if token and basic:
        raise BadInput("prometheus: give bearer_token_env or username_env/password_env, not both")
    return token, basic


def prometheus_source(
    settings: "Settings", auth: PrometheusAuth | None = None, environ: Mapping[str, str] | None = None
) -> "PrometheusSource":
    """The Prometheus source the settings describe: URL, auth, TLS, timeout, retries, matchers,
    label convention — the same for ``audit``, ``doctor``, ``run`` and the operator."""
    from auditor.sources.prometheus import PrometheusSource

    p = settings.prometheus
    if not p.url:
        raise BadInput("prometheus.url is not set (settings file, GPU_AUDITOR_PROMETHEUS_URL or --prometheus)")
    if p.ca_file and not Path(p.ca_file).is_file():
        raise BadInput(f"prometheus.ca_file (--prometheus-ca-file) {p.ca_file}: no such file")
    token, basic = prometheus_credentials(settings, auth, environ)
    return PrometheusSource(
        p.url,
        bearer_token=token,
        basic_auth=basic,
        ca_file=p.ca_file,
        insecure=not p.tls_verify,
        timeout=p.timeout.total_seconds(),
        retries=p.retries,
        tenant=p.tenant,
        matchers=p.matchers,
        pod_labels=None if p.label_convention == "auto" else p.label_convention,
        answer_deadline=p.answer_deadline.total_seconds() if p.answer_deadline else None,
        max_series_per_answer=p.max_series_per_answer,
        max_series_per_cycle=p.max_series_per_cycle,
        max_read_memory_mb=p.max_read_memory_mb,
    )


def kube_api(settings: "Settings", *, dry_run: bool = False, check: bool = False) -> "ApiClient":
    """The Kubernetes API client of ``kubernetes:``; read-only (every write refused) for a dry run;
    ``check``: make one request first, so an unreachable API server is one clear error."""
    from auditor.kube.client import KubeConfig, api_client, check_reachable, read_only

    k = settings.kubernetes
    api = api_client(
        KubeConfig(kubeconfig=k.kubeconfig, in_cluster=k.in_cluster, context=k.context, impersonate=k.impersonate)
    )
    if check:
        check_reachable(api)
    return read_only(api) if dry_run else api


def read_only(api: "ApiClient") -> "ApiClient":
    """``api`` with every write refused (an operator dry run handed a client of its own)."""
    from auditor.kube.client import read_only as refuse_writes

    return refuse_writes(api)


def kube_username(settings: "Settings") -> str:
    """Who the Kubernetes API says the configured credentials are (``ack --by`` left out)."""
    from auditor.kube.whoami import username

    api = kube_api(settings)
    try:
        return username(api)
    finally:
        api.close()


def kueue_priority_boost(settings: "Settings") -> tuple[str, str]:
    """Kueue's PriorityBoost feature as the cluster shows it (a dry-run patch): (state, detail)."""
    from auditor.kube.kueue_features import probe_priority_boost

    api = kube_api(settings)
    try:
        probe = probe_priority_boost(api)
    finally:
        api.close()
    return probe.state, probe.detail


def kueue_findings(settings: "Settings", api: "ApiClient | None" = None) -> list[Any]:
    """The cluster's Kueue version and the feature gates the configured options rest on
    (demotion, ``requeue.lowerPriorityBy`` of any policy: PriorityBoost; hold-before-quota, the
    chart's ``gate.holdBeforeQuota``: AdmissionGatedBy), one
    :class:`~auditor.kube.kueue_features.FeatureLine` each, for ``doctor`` and the operator's start
    (issue 29). A stock Kueue leaves both gates off before v0.19, and PriorityBoost off in v0.19."""
    from auditor.kube.kueue_features import kueue_findings as findings
    from auditor.kube.kueue_features import needed_gates
    from auditor.operator_loop.policies import policy_files
    from auditor.policy.loader import parse_policies

    lower = False
    for name, text in policy_files(settings).items():
        try:
            lower = lower or any(p.spec.requeue.lower_priority_by for p in parse_policies(text, name))
        except BadInput:  # a bad file is the policy stage's to report (PolicyError)
            continue
    hold = settings.gate.enabled and settings.gate.holds_namespace is not None
    own = api is None
    api = api or kube_api(settings)
    try:
        return findings(api, needs=needed_gates(lower_priority=lower, hold_before_quota=hold))
    finally:
        if own:
            api.close()


def kueue_gate_objects(settings: "Settings") -> tuple[list[dict] | None, list[dict] | None, str]:
    """The gate's AdmissionChecks and every ClusterQueue, for ``doctor``: (checks, queues, error),
    a list None when it could not be read (``error`` says why)."""
    from auditor.gate.kueue import CONTROLLER_NAME
    from auditor.kube.gate_objects import read_gate_objects

    api = kube_api(settings)
    try:
        got = read_gate_objects(api, CONTROLLER_NAME)
    finally:
        api.close()
    return got.checks, got.queues, got.error


def kube_resolver(settings: "Settings", api: "ApiClient") -> "KubeResolver":
    """Pods → jobs and teams through the API (owner chains, Kueue, team sources), not started."""
    from auditor.kube.resolver import KubeResolver

    return KubeResolver(
        api,
        cluster=settings.cluster,
        team_sources=settings.team_sources,
        kueue=settings.features.kueue,
        unresolved_pods=settings.unresolved_pods,
        deleted_pod_memory=settings.deleted_pod_memory,
        clock=clock(),
    )


def mfu_plan(settings: "Settings") -> "MfuPlan":
    """What each audited job's MFU is measured against, from ``mfu:`` (the workload classes, else
    the shipped ones; the lineage's best earlier run): the same for ``audit``, ``demo`` and the
    operator's cycles."""
    from auditor.engine import MfuPlan

    return MfuPlan(classes=settings.mfu.workload_classes(), lineage_best=settings.mfu.lineage_best)


def kube_actions(api: "ApiClient", instance: str | None = None) -> "KubeActions":
    """The cluster writes the policies make (annotations, Events, requeues)."""
    from auditor.actions import KubeActions

    return KubeActions(api) if instance is None else KubeActions(api, instance=instance)


def check_requeue(gate: Any) -> "CheckRequeue":
    """The policy ladder's requeue through the efficiency gate's AdmissionCheck, on the controller
    that ``gate`` (the operator's :class:`auditor.gate.stage.GateStage`) runs while this replica
    leads (:class:`auditor.gate.requeue.GateRequeue`)."""
    from auditor.gate.requeue import GateRequeue

    return GateRequeue(lambda: gate.controller)


def lease_elector(
    settings: "Settings",
    api: "ApiClient",
    *,
    identity: str,
    clock: "Clock",
    on_started: Callable[[], None],
    on_stopped: Callable[[], None],
    on_fatal: Callable[["LeaseUnavailable"], None],
    lease_name: str | None = None,
) -> "LeaderElector":
    """The operator's leader elector on ``leader_election:``'s Lease (its namespace resolved as
    :func:`auditor.kube.lease.lease_namespace` says), timed by ``clock``; ``lease_name`` for a
    shard's own Lease (``<lease_name>-shard-<i>``)."""
    from auditor.kube.lease import LeaderElector, lease_namespace

    le, k = settings.leader_election, settings.kubernetes
    namespace, origin = lease_namespace(
        le.namespace, in_cluster=k.in_cluster, kubeconfig=k.kubeconfig, context=k.context
    )
    return LeaderElector(
        api,
        namespace=namespace,
        namespace_origin=origin,
        name=lease_name or le.lease_name,
        identity=identity,
        lease_duration=le.lease_duration,
        renew_deadline=le.renew_deadline,
        retry_period=le.retry_period,
        on_started=on_started,
        on_stopped=on_stopped,
        on_fatal=on_fatal,
        clock=clock,
    )


def report_destinations(settings: "Settings") -> "Destinations":
    """The weekly reports' Slack channels and webhook, from ``notifications:`` (secrets from the
    variables it names)."""
    from auditor.reports import Destinations

    return Destinations.from_settings(settings.notifications)


def store(settings: "Settings", *, read_only: bool = False) -> "Store":
    """The store of ``store:`` (``GPU_AUDITOR_DATABASE_URL`` and ``--db`` already merged in);
    ``read_only`` for the commands that only read (nothing written, the schema only checked)."""
    from auditor.store import Store

    return Store.open(settings.database_url(), read_only=read_only)


def store_at(url: str) -> "Store":
    """The store at an explicit URL, migrated on open (the demo's own SQLite file)."""
    from auditor.store import Store

    return Store.open(url)


def replay_source(feeds: Any, *, end: datetime, duration: timedelta, interval: timedelta) -> "ReplaySource":
    """A metric source replaying recorded traces (the demo's bundled H200 traces)."""
    from auditor.sources.replay import ReplaySource

    return ReplaySource(feeds, end=end, duration=duration, interval=interval)


def clock() -> "Clock":
    """The process's clock (the wall clock and the monotonic one)."""
    return SYSTEM_CLOCK


def operator(
    settings: "Settings",
    *,
    auth: PrometheusAuth | None = None,
    dry_run: bool = False,
    **given: Any,
) -> "Operator":
    """The operator with every adapter built from ``settings`` (``given`` ones, e.g. a test's
    store or clock, are used instead)."""
    from auditor.operator_loop.service import Operator

    if "source" not in given:
        given["source"] = prometheus_source(settings, auth)
    return Operator(settings, dry_run=dry_run, **given)


def console(
    settings: "Settings", store: "Store", clock: Callable[[], datetime], *, writes: bool, base: str = "/console"
) -> "ConsoleApp":
    """The web console on ``store`` (:class:`auditor.console.app.ConsoleApp`): its reader, the
    acknowledgement log when ``writes``, prices from ``reports:``, and the escalation ladders and
    gate rules of the settings' policy files (read once, as ``ack`` reads them)."""
    from auditor.console.app import ConsoleApp, ConsoleConfig
    from auditor.console.pages import Step
    from auditor.core.gate import GateMode
    from auditor.operator_loop.policies import policy_files
    from auditor.policy.loader import PolicyRegistry
    from auditor.store.console_queries import ConsoleQueries
    from auditor.store.lineage import AckLog

    registry = PolicyRegistry()
    registry.update(policy_files(settings))
    ladders = {
        p.name: [Step(tuple(str(a.value) for a in s.actions), s.after, s.cooldown) for s in p.spec.escalation]
        for p in registry.policies
    }
    config = ConsoleConfig(
        base=base,
        writes=writes,
        prices=dict(settings.reports.prices),
        currency=settings.reports.currency,
        ladders=ladders,
        gate_rules=[g.rule() for g in registry.gate_policies],
        gate_mode=GateMode(settings.gate.mode),
        gate_enabled=settings.gate.enabled,
    )
    return ConsoleApp(
        ConsoleQueries(store), clock, config, acks=AckLog(store) if writes else None, snoozes=store.job_snoozes()
    )
