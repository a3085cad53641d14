"""``doctor``: check the telemetry chain an audit depends on, and say what to fix.

An audit is only as honest as its inputs: SM activity is off in every shipped dcgm-exporter CSV,
``honorLabels: false`` hides workload pods in ``exported_pod``, GPUs without pod labels cannot be
attributed. Each check here looks at one link of the chain through the same Prometheus source the
audit uses (one bucketed read of the last hour, plus a couple of metadata calls) and returns a
:class:`Check` with a status and, when something is off, the concrete fix.

Required checks (a failure makes ``doctor`` exit 1): Prometheus reachable, DCGM series present,
a busy signal (GPU_UTIL or GR_ENGINE_ACTIVE), SM activity present. The rest are advice.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Callable

from auditor.core.metrics import SPECS, Metric, Naming, name_for
from auditor.core.model import Window
from auditor.errors import AuditorError

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"

CSV_LINES = {
    Metric.GPU_UTIL: "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).",
    Metric.GR_ENGINE_ACTIVE: "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active.",
    Metric.SM_ACTIVE: "DCGM_FI_PROF_SM_ACTIVE,        gauge, The ratio of cycles an SM has at least 1 warp assigned.",
    Metric.SM_OCCUPANCY: "DCGM_FI_PROF_SM_OCCUPANCY,     gauge, The ratio of number of warps resident on an SM.",
    Metric.TENSOR_ACTIVE: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.",
    Metric.DRAM_ACTIVE: "DCGM_FI_PROF_DRAM_ACTIVE,      gauge, Ratio of cycles the device memory interface is active.",
    Metric.FP32_ACTIVE: "DCGM_FI_PROF_PIPE_FP32_ACTIVE, gauge, Ratio of cycles the fp32 pipes are active.",
    Metric.FP16_ACTIVE: "DCGM_FI_PROF_PIPE_FP16_ACTIVE, gauge, Ratio of cycles the fp16 pipes are active.",
    Metric.MAX_SM_CLOCK: "DCGM_FI_DEV_MAX_SM_CLOCK,      gauge, Maximum supported SM clock (MHz).",
    Metric.SM_CLOCK: "DCGM_FI_DEV_SM_CLOCK,          gauge, SM clock frequency (in MHz).",
    Metric.POWER: "DCGM_FI_DEV_POWER_USAGE,       gauge, Power draw (in W).",
    Metric.PCIE_RX: "DCGM_FI_PROF_PCIE_RX_BYTES,    gauge, The rate of data received over the PCIe bus (in bytes/s).",
    Metric.PCIE_TX: "DCGM_FI_PROF_PCIE_TX_BYTES,    gauge, The rate of data transmitted over the PCIe bus (in bytes/s).",
}

ENABLE_HOW = (
    "add to dcgm-exporter's counters CSV (Helm chart: the `exporter-metrics-config-map` ConfigMap via "
    "`customMetrics`; GPU Operator: a ConfigMap with key `dcgm-metrics.csv` referenced by "
    "`dcgmExporter.config.name`) and restart the exporter pods:\n"
)


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the checklist."""

    name: str
    status: str
    detail: str
    fix: str = ""
    required: bool = False

    @property
    def failed(self) -> bool:
        return self.required and self.status == FAIL


@dataclass(frozen=True)
class Telemetry:
    """What the checks look at, read once: the last ``lookback`` of DCGM series through the
    audit's own Prometheus source, bucketed as an audit buckets them."""

    source: Any  # a PrometheusSource (its client, URL, matchers and the read's stats)
    now: datetime
    lookback: timedelta
    report: Any  # the read's SourceReport
    stats: Any  # the source's stats of that read

    @property
    def hours(self) -> float:
        return self.lookback.total_seconds() / 3600

    @property
    def naming(self) -> Naming:
        return self.stats.naming


#: One check: looks at the telemetry and says zero or more lines of the checklist.
CheckFn = Callable[[Telemetry], list[Check]]


def run_checks(source: Any, now: datetime, lookback: timedelta = timedelta(hours=1)) -> list[Check]:
    """Run every check against ``source`` (a :class:`~auditor.sources.prometheus.PrometheusSource`).

    The first three (Prometheus reachable, DCGM series readable and present) gate the rest: when
    one fails there is nothing to look at. Then each check of :data:`CHECKS` runs, in order.
    """
    checks: list[Check] = []
    telemetry = _read(source, now, lookback, checks)
    if telemetry is not None:
        for check in CHECKS:
            checks.extend(check(telemetry))
    return checks


def _read(source: Any, now: datetime, lookback: timedelta, checks: list[Check]) -> Telemetry | None:
    """The gate checks, appended to ``checks``; the telemetry when all three passed."""
    client = source.client
    try:
        info = client.buildinfo()
        client.query("vector(1)")
    except AuditorError as exc:
        checks.append(
            Check("Prometheus reachable", FAIL, str(exc), "check the URL, the network path and the credentials", True)
        )
        return None
    version = info.get("version") or "version not reported"
    checks.append(Check("Prometheus reachable", OK, f"{source.url} ({version})", required=True))

    width = timedelta(minutes=5)
    window = Window(now - lookback, now)
    try:
        result = source.read(window, width)
    except AuditorError as exc:
        checks.append(Check("DCGM series readable", FAIL, str(exc), "", True))
        return None
    t = Telemetry(source, now, lookback, result.report, source.stats)
    stats = t.stats
    if not stats.names:
        checks.append(
            Check(
                "DCGM series present",
                FAIL,
                f"no DCGM_FI_* series in the last {t.hours:g} h",
                "is dcgm-exporter running on the GPU nodes and scraped? Check its ServiceMonitor/PodMonitor "
                '(or scrape config) and `up{job=~".*dcgm.*"}`; with --match, check the matcher',
                True,
            )
        )
        return None
    style = stats.naming_why or str(stats.naming)
    spelled = {m: [n for n in SPECS[m].names if n in stats.names] for m in SPECS}
    if any(len(v) > 1 for v in spelled.values()):
        style += "; some metrics under two names (exporters of two versions, or a rename inside the window)"
    checks.append(
        Check("DCGM series present", OK, f"{len(stats.names)} names ({style}): {', '.join(stats.names)}", required=True)
    )
    return t


def check_gpu_util_unit(t: Telemetry) -> list[Check]:
    """Whether GPU utilization is a percent or a 0-1 ratio (dcgm-exporter 4.9 changed it)."""
    if "cannot tell" not in (t.stats.naming_why or ""):
        return []
    return [
        Check(
            "GPU utilization unit",
            WARN,
            t.stats.naming_why,
            "dcgm-exporter 4.9 exports DCGM_FI_DEV_GPU_UTIL_RATIO as a 0–1 ratio, DCGM 4.6's field 203 is a "
            "percent; keep DCGM_FI_DEV_SM_CLOCK_HERTZ (in 4.9's default CSV) in the counters CSV so the "
            "naming is known, or export DCGM_FI_DEV_GPU_UTIL (a percent under every naming)",
        )
    ]


def check_busy_signal(t: Telemetry) -> list[Check]:
    """A busy signal (required): every verdict starts from it."""
    naming = t.naming
    busy = [m for m in (Metric.GPU_UTIL, Metric.GR_ENGINE_ACTIVE) if m in t.report.present]
    return [
        Check(
            "busy signal (GPU_UTIL or GR_ENGINE_ACTIVE)",
            OK if busy else FAIL,
            ", ".join(m.value for m in busy) if busy else "neither GPU_UTIL nor GR_ENGINE_ACTIVE has series",
            "" if busy else ENABLE_HOW + _csv(Metric.GPU_UTIL, naming) + "\n" + _csv(Metric.GR_ENGINE_ACTIVE, naming),
            True,
        )
    ]


def check_mig_busy_signal(t: Telemetry) -> list[Check]:
    """MIG instances have no GPU_UTIL: their busy signal is GR_ENGINE_ACTIVE."""
    if not t.stats.mig or Metric.GR_ENGINE_ACTIVE in t.report.present:
        return []
    return [
        Check(
            "MIG busy signal",
            WARN,
            "MIG instances found but no GR_ENGINE_ACTIVE (MIG has no GPU_UTIL)",
            ENABLE_HOW + _csv(Metric.GR_ENGINE_ACTIVE, t.naming),
        )
    ]


def check_sm_activity(t: Telemetry) -> list[Check]:
    """SM activity (required), on every node: off in every shipped dcgm-exporter CSV."""
    stats, naming = t.stats, t.naming
    if Metric.SM_ACTIVE not in t.report.present:
        return [
            Check(
                "profiling: SM activity",
                FAIL,
                "DCGM_FI_PROF_SM_ACTIVE absent: it is commented out in every shipped dcgm-exporter CSV, "
                "so audits can only say idle/underutilized, and SM-based verdicts become insufficient_data",
                ENABLE_HOW
                + _csv(Metric.SM_ACTIVE, naming)
                + "\n"
                + _csv(Metric.SM_OCCUPANCY, naming)
                + "\n(profiling also needs the SYS_ADMIN capability and a Volta or newer datacenter GPU; "
                "look for 'Skipping line ... metric not enabled' in the exporter log)",
                True,
            )
        ]
    missing_hosts = sorted(h for h, ms in stats.hosts.items() if Metric.SM_ACTIVE not in ms)
    if not missing_hosts:
        return [Check("profiling: SM activity", OK, f"{_names(Metric.SM_ACTIVE, stats.names)} present", required=True)]
    return [
        Check(
            "profiling: SM activity",
            WARN,
            f"present, but not on {len(missing_hosts)} node(s): {', '.join(missing_hosts[:10])}"
            + (" ..." if len(missing_hosts) > 10 else ""),
            "those nodes' exporters lack the SM_ACTIVE line or profiling (SYS_ADMIN, Volta+ datacenter GPU); "
            + ENABLE_HOW
            + _csv(Metric.SM_ACTIVE, naming),
            True,
        )
    ]


#: The advisory fields and what each adds to an audit.
ADVISORY = {
    Metric.TENSOR_ACTIVE: "needed for no_tensor_cores/memory_bound and the MFU estimate",
    Metric.DRAM_ACTIVE: "needed to tell memory-bound work from compute",
    Metric.SM_OCCUPANCY: "adds occupancy to the evidence",
    Metric.FP32_ACTIVE: "separates fp32 math on CUDA cores from latency-bound memory work",
    Metric.POWER: "feeds the silent-zero telemetry guard",
    Metric.MAX_SM_CLOCK: "scales the MFU estimate by clock",
    Metric.PCIE_RX: "shows a copy-only job's transfers (copy_only finding)",
}


def check_optional_fields(t: Telemetry) -> list[Check]:
    """The advisory fields present and absent (each absent one with its CSV line)."""
    present = t.report.present
    have = [m for m in ADVISORY if m in present]
    lack = [m for m in ADVISORY if m not in present]
    out: list[Check] = []
    if have:
        out.append(Check("optional fields present", OK, ", ".join(_names(m, t.stats.names) for m in have)))
    if lack:
        out.append(
            Check(
                "optional fields absent",
                WARN,
                "; ".join(f"{m.value} ({ADVISORY[m]})" for m in lack),
                ENABLE_HOW + "\n".join(_csv(m, t.naming) for m in lack),
            )
        )
    return out


def check_label_convention(t: Telemetry) -> list[Check]:
    """Where the workload pod's name is (``honorLabels: false`` moves it to exported_pod)."""
    labels = t.report.labels
    if labels.get("pod") == "exported_pod":
        return [
            Check(
                "label convention",
                WARN,
                "workload pods are in exported_pod/exported_namespace: dcgm-exporter is scraped with honorLabels: false "
                "(pod names the exporter itself). gpu-auditor reads exported_pod, but other dashboards aggregating "
                "by pod collapse every GPU of a node into the exporter",
                "set `honorLabels: true` on dcgm-exporter's ServiceMonitor (Helm: serviceMonitor.honorLabels=true; "
                "GPU Operator: dcgmExporter.serviceMonitor.honorLabels=true)",
            )
        ]
    return [
        Check(
            "label convention",
            OK,
            f"workload pods in {labels.get('pod', 'pod')}/{labels.get('namespace', 'namespace')}",
        )
    ]


def check_device_labels(t: Telemetry) -> list[Check]:
    """Which labels name the host and the GPU (information)."""
    labels = t.report.labels
    return [
        Check(
            "device labels",
            INFO,
            f"host label {labels.get('hostname', '(none)')}, GPU id {labels.get('uuid', '(none)')}"
            + (", MIG instances (GPU_I_ID)" if t.stats.mig else ""),
        )
    ]


def check_pod_attribution(t: Telemetry) -> list[Check]:
    """How many GPUs carry a workload pod label: the rest cannot be attributed to a job."""
    stats = t.stats
    total, attributed = len(stats.gpus), len(stats.attributed)
    share = attributed / total if total else 0.0
    out: list[Check] = []
    if stats.exporter_pods:
        out.append(
            Check(
                "pod attribution",
                WARN,
                f"pod label names dcgm-exporter itself ({', '.join(sorted(stats.exporter_pods)[:5])})",
                "scrape dcgm-exporter with honorLabels: true so workload pods keep their own labels",
            )
        )
    if attributed == 0:
        out.append(
            Check(
                "pod attribution",
                WARN,
                f"0 of {total} GPUs carry a workload pod label in the last {t.hours:g} h",
                "if GPUs were in use: run dcgm-exporter with --kubernetes (DCGM_EXPORTER_KUBERNETES=true) and the "
                "kubelet pod-resources socket mounted; pods must request nvidia.com/gpu (or nvidia.com/mig-*) "
                "— GPUs seen only through NVIDIA_VISIBLE_DEVICES are never attributed",
            )
        )
    else:
        out.append(
            Check(
                "pod attribution",
                OK,
                f"{attributed} of {total} GPUs ({share:.0%}) attributed to pods"
                + (
                    f"; {total - attributed} had no pod label (not in use, or not attributed)"
                    if attributed < total
                    else ""
                ),
            )
        )
    return out


def check_garbage_values(t: Telemetry) -> list[Check]:
    """Values the audit dropped (driver/DCGM bugs)."""
    dropped = t.report.dropped
    if not dropped:
        return []
    return [
        Check(
            "garbage values",
            WARN,
            "dropped: " + ", ".join(f"{m.value} {n}" for m, n in sorted(dropped.items(), key=lambda kv: kv[0].value)),
            "values like GPU_UTIL 4294967295 or NaN come from driver/DCGM bugs (DCGM #199); the audit drops them",
        )
    ]


def check_sample_interval(t: Telemetry) -> list[Check]:
    """The time between samples (information; faster than the exporter's collect interval repeats values)."""
    interval = t.report.scrape_interval
    if not interval:
        return []
    return [
        Check(
            "sample interval",
            INFO,
            f"about {interval:g} s between samples"
            + (
                " (faster than dcgm-exporter's 30 s default collect interval: each value is stored more than once)"
                if interval < 30
                else ""
            ),
        )
    ]


def check_hostile_identities(t: Telemetry) -> list[Check]:
    """Series whose pod, namespace or container label no Kubernetes object could have (e.g. a
    ``/`` in a pod name): refused at the edge (auditor/core/identity.py) and never audited, so a
    job may be missing; said only when there are some (one line per reason)."""
    rejected = getattr(t.report, "rejected", None)
    if not rejected:
        return []
    return [
        Check(
            "hostile identities",
            WARN,
            line,
            "these series are not audited: find what writes the labels (a relabeling rule, a Pushgateway, "
            "a workload's own exporter) and fix or drop them there",
        )
        for line in rejected.lines()
    ]


def check_prometheus_warnings(t: Telemetry) -> list[Check]:
    """The warnings Prometheus returned with the reads."""
    return [Check("Prometheus warning", WARN, w) for w in t.source.client.warnings]


def check_kube_state_metrics(t: Telemetry) -> list[Check]:
    """kube-state-metrics' pod series (optional: owners and GPU requests in Prometheus)."""
    now, lookback = t.now, t.lookback
    try:
        ksm = t.source.names_present(
            ["kube_pod_owner", "kube_pod_info", "kube_pod_container_resource_requests"],
            int((now - lookback).timestamp() * 1000),
            int(now.timestamp() * 1000),
        )
    except AuditorError as exc:
        return [Check("kube-state-metrics", WARN, f"could not check: {exc}")]
    if ksm:
        return [Check("kube-state-metrics", OK, f"{', '.join(sorted(ksm))} present")]
    return [
        Check(
            "kube-state-metrics",
            WARN,
            "no kube_pod_owner/kube_pod_info series",
            "optional with --no-kube; install kube-state-metrics (it ships with kube-prometheus-stack) to see "
            "pod owners and GPU requests in Prometheus",
        )
    ]


#: The telemetry checks, in the checklist's order. A new check is one function here; checks
#: that need more than Prometheus (the Kueue gate below) are added by the command that has it.
CHECKS: list[CheckFn] = [
    check_gpu_util_unit,
    check_busy_signal,
    check_mig_busy_signal,
    check_sm_activity,
    check_optional_fields,
    check_label_convention,
    check_device_labels,
    check_pod_attribution,
    check_hostile_identities,
    check_garbage_values,
    check_sample_interval,
    check_prometheus_warnings,
    check_kube_state_metrics,
]


def kueue_priority_boost_check(state: str, detail: str) -> Check:
    """Kueue's ``PriorityBoost`` gate (:func:`auditor.kube.kueue_features.probe_priority_boost`
    finds ``state``): requeue's ``lowerPriorityBy`` writes an annotation that acts only with it."""
    name = "Kueue PriorityBoost gate"
    if state == "on":
        return Check(name, OK, f"on: {detail}")
    if state == "off":
        return Check(
            name,
            WARN,
            f"off: {detail}; requeue.lowerPriorityBy writes kueue.x-k8s.io/priority-boost, which Kueue then ignores",
            "set `featureGates: {PriorityBoost: true}` in Kueue's manager configuration (the "
            "kueue-manager-config ConfigMap; alpha since v0.17) or start Kueue with "
            "--feature-gates=PriorityBoost=true, or leave requeue.lowerPriorityBy unset",
        )
    return Check(name, INFO, f"unknown: {detail}")


#: the gate's AdmissionCheck controller (auditor/gate/kueue.py CONTROLLER_NAME; doctor may not import
#: the Kubernetes side, the reader in auditor/kube/gate_objects.py filters by it)
GATE_CONTROLLER = "gpu-auditor.io/efficiency-gate"


def _condition(obj: dict, kind: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def _name(obj: dict) -> str:
    return str((obj.get("metadata") or {}).get("name") or "?")


def _said(cond: dict) -> str:
    """A condition as Kueue wrote it: ``status reason: message``."""
    return " ".join(x for x in (cond.get("status"), f"{cond.get('reason') or ''}:", cond.get("message")) if x)


def gate_admission_check_checks(checks: list[dict], *, enabled: bool) -> list[Check]:
    """The gate's AdmissionChecks (``spec.controllerName`` ours) and their ``Active`` condition.

    Kueue admits nothing through a ClusterQueue that lists an AdmissionCheck which is not
    ``Active`` (the queue turns Inactive, reason ``AdmissionCheckInactive``), and only the
    operator's gate controller, running as leader, sets it: a check that is not Active is the one
    thing that turns the gate from harmless into a stopped queue, so it is said first."""
    name = "gate: AdmissionCheck"
    if not checks:
        return [
            Check(
                name,
                WARN if enabled else INFO,
                f"no AdmissionCheck with spec.controllerName {GATE_CONTROLLER}"
                + ("" if enabled else " (the gate is off here)"),
                "the chart renders one with --set gate.enabled=true (gate.admissionCheckName, default "
                "gpu-efficiency); without the chart apply {apiVersion: kueue.x-k8s.io/v1beta2, kind: AdmissionCheck, "
                f"metadata: {{name: gpu-efficiency}}, spec: {{controllerName: {GATE_CONTROLLER}}}}}",
            )
        ]
    out: list[Check] = []
    for ac in checks:
        cond = _condition(ac, "Active")
        if cond.get("status") == "True":
            out.append(Check(name, OK, f"{_name(ac)} Active ({_said(cond)})"))
            continue
        out.append(
            Check(
                name,
                WARN,
                f"{_name(ac)} not Active ("
                + (_said(cond) if cond else "no Active condition: no controller has answered it yet")
                + "); every ClusterQueue listing it admits nothing",
                "the operator's gate controller sets it Active when it runs (gate.enabled, on the leader): check the "
                "operator's pods and its log (`kubectl -n NAMESPACE logs deploy/RELEASE-gpu-auditor`); if the gate is "
                "gone for good, detach the check from its ClusterQueues",
            )
        )
    return out


def _gpu_resource(resource: str) -> bool:
    """A GPU in a ClusterQueue's quota: a whole GPU or a MIG slice (the resources pods request)."""
    return resource == "nvidia.com/gpu" or resource.startswith("nvidia.com/mig-") or resource.endswith("/gpu")


def queue_flavors(queue: dict) -> tuple[list[str], list[str]]:
    """A ClusterQueue's flavors and, of those, its GPU flavors (a flavor of a resource group whose
    ``coveredResources`` holds a GPU resource), each in the queue's order."""
    flavors: list[str] = []
    gpu: list[str] = []
    for group in (queue.get("spec") or {}).get("resourceGroups") or []:
        covers_gpu = any(_gpu_resource(str(r)) for r in group.get("coveredResources") or [])
        for f in group.get("flavors") or []:
            n = str(f.get("name"))
            if n not in flavors:
                flavors.append(n)
            if covers_gpu and n not in gpu:
                gpu.append(n)
    return flavors, gpu


def queue_check_rules(queue: dict) -> dict[str, list[str]]:
    """The AdmissionChecks a ClusterQueue runs: name → ``onFlavors`` (empty: every flavor), from
    ``.spec.admissionChecksStrategy.admissionChecks`` (v1beta2; v1beta1 also has the flat
    ``.spec.admissionChecks``, names only)."""
    spec = queue.get("spec") or {}
    rules: dict[str, list[str]] = {str(n): [] for n in spec.get("admissionChecks") or []}
    for rule in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []:
        rules[str(rule.get("name"))] = [str(f) for f in rule.get("onFlavors") or []]
    return rules


def attach_patch(queue: dict, check: str) -> str:
    """The ``kubectl patch`` that attaches ``check`` to ``queue`` on its GPU flavors, keeping the
    checks it already runs (a merge patch replaces the whole list)."""
    rules = [{"name": n, **({"onFlavors": f} if f else {})} for n, f in queue_check_rules(queue).items() if n != check]
    gpu = queue_flavors(queue)[1]
    rules.append({"name": check, **({"onFlavors": gpu} if gpu else {})})
    body = json.dumps({"spec": {"admissionChecksStrategy": {"admissionChecks": rules}}}, separators=(",", ":"))
    return f"kubectl patch clusterqueue {_name(queue)} --type=merge -p '{body}'"


def gate_queue_checks(check_names: list[str], queues: list[dict]) -> list[Check]:
    """Which ClusterQueues run the gate's check, on which flavors, and which GPU queues do not.

    Scoped to the GPU flavors (``onFlavors``) the gate judges only GPU jobs; on every flavor of a
    queue that also has CPU flavors it holds CPU jobs to its answer too (docs/gate.md, "When the
    gate decides"); a GPU flavor left out of ``onFlavors`` escapes the gate."""
    name = "gate: ClusterQueues"
    out: list[Check] = []
    attached: set[str] = set()
    for q in queues:
        rules = queue_check_rules(q)
        flavors, gpu = queue_flavors(q)
        for check in (c for c in check_names if c in rules):
            attached.add(_name(q))
            on = rules[check]
            cond = _condition(q, "Active")
            inactive = f"; the ClusterQueue is not Active ({_said(cond)})" if cond.get("status") == "False" else ""
            where = f"{_name(q)} runs {check}"
            if not on:
                others = [f for f in flavors if f not in gpu]
                scope = f"on every flavor ({', '.join(flavors) or 'none'})"
                if others and gpu:
                    out.append(
                        Check(
                            name,
                            WARN,
                            f"{where} {scope}, not scoped to its GPU flavors: non-GPU flavor(s) {', '.join(others)} "
                            f"wait for the gate too{inactive}",
                            "scope it with onFlavors: " + attach_patch(q, check),
                        )
                    )
                else:
                    out.append(Check(name, WARN if inactive else OK, f"{where} {scope}, a GPU-only queue{inactive}"))
                continue
            missing = [f for f in gpu if f not in on]
            extra = [f for f in on if f not in gpu]
            detail = f"{where} onFlavors [{', '.join(on)}]"
            problems = ([f"GPU flavor(s) {', '.join(missing)} not checked"] if missing else []) + (
                [f"{', '.join(extra)} not a GPU flavor of this queue"] if extra else []
            )
            if problems:
                out.append(
                    Check(
                        name,
                        WARN,
                        f"{detail}: {'; '.join(problems)}{inactive}",
                        "list its GPU flavors: " + attach_patch(q, check),
                    )
                )
            else:
                out.append(Check(name, WARN if inactive else OK, f"{detail}, scoped to its GPU flavors{inactive}"))
    gpu_queues = [q for q in queues if queue_flavors(q)[1]]
    for check in check_names:
        if any(check in queue_check_rules(q) for q in queues):
            continue
        out.append(
            Check(
                name,
                WARN,
                f"no ClusterQueue lists {check} in .spec.admissionChecksStrategy: it decides nothing",
                (
                    "attach it to each ClusterQueue whose GPU jobs it should judge, on the GPU flavors, e.g.\n"
                    + "\n".join(attach_patch(q, check) for q in gpu_queues)
                )
                if gpu_queues
                else "no ClusterQueue has GPU quota (nvidia.com/gpu or nvidia.com/mig-* in coveredResources)",
            )
        )
    bare = [q for q in gpu_queues if _name(q) not in attached]
    if check_names and attached and bare:
        out.append(
            Check(
                name,
                WARN,
                f"ClusterQueue(s) with GPU quota without the gate: {', '.join(_name(q) for q in bare)}",
                "\n".join(attach_patch(q, check_names[0]) for q in bare),
            )
        )
    return out


def kueue_feature_checks(lines: list[Any]) -> list[Check]:
    """Kueue's version and the feature gates the chosen options rest on, one line each: the
    ``FeatureLine`` s (level, subject, text) that :func:`auditor.kube.kueue_features.kueue_findings`
    finds, as doctor's checks, each gate that is off with how to turn it on."""
    out: list[Check] = []
    for line in lines:
        fix = ""
        if line.level == WARN and line.subject.endswith(" gate"):
            gate = line.subject.removeprefix("Kueue ").removesuffix(" gate")
            fix = (
                f"set `featureGates: {{{gate}: true}}` in Kueue's manager configuration (the kueue-manager-config "
                f"ConfigMap, key controller_manager_config.yaml) or start Kueue with --feature-gates={gate}=true, "
                "then restart Kueue's controller"
            )
        elif line.level == WARN:
            fix = 'upgrade Kueue (docs/gate.md, "Kueue versions")'
        out.append(Check(line.subject, line.level if line.level in (OK, WARN, INFO) else INFO, line.text, fix))
    return out


def ack_link_key_check(key_file: str, base_url: str | None, read_key: Callable[[str], bytes]) -> Check:
    """The gate's signed-link key (``gate.ack_link_key_file``, the chart's ``gate.ackLinks.keySecret``
    mounted as a file): the operator runs on without it, so only doctor says that links are off."""
    name = "gate: acknowledgement-link key"
    try:
        key = read_key(key_file)
    except AuditorError as exc:
        return Check(
            name,
            WARN,
            f"{exc}: the operator runs, but alerts carry no acknowledgement link and /gate/ack answers 503",
            "create the Secret that gate.ackLinks.keySecret names in the release namespace, with at least 16 random "
            "bytes (`kubectl create secret generic NAME --from-literal=key=$(openssl rand -hex 32)`), then restart "
            "the operator (`kubectl rollout restart deployment/...`): the key is read when it starts",
        )
    if not base_url:
        return Check(name, INFO, f"{len(key)} bytes; gate.ack_link_base_url unset: alerts carry no link")
    return Check(name, OK, f"{len(key)} bytes; alerts link to {base_url.rstrip('/')}/gate/ack")


def _csv(metric: Metric, naming: Naming = Naming.CLASSIC) -> str:
    """The counters-CSV line that enables ``metric``, spelled as ``naming``'s exporter spells it."""
    line = CSV_LINES[metric]
    name = name_for(metric, naming)
    line = line.replace(SPECS[metric].names[0] + ",", name + ",", 1)
    if name.endswith("_HERTZ"):
        line = line.replace("MHz", "Hz")
    if metric is Metric.GPU_UTIL and naming in (Naming.EXPORTER49, Naming.EXPORTER410):
        line = line.replace("(in %)", "(ratio 0-1)")
    return line


def _names(metric: Metric, found: list[str]) -> str:
    return " / ".join(n for n in SPECS[metric].names if n in found) or metric.value


def format_checks(checks: list[Check]) -> str:
    """The checklist as text: one line per check, the fix indented under it."""
    marks = {OK: "[ ok ]", WARN: "[warn]", FAIL: "[FAIL]", INFO: "[info]"}
    lines: list[str] = []
    for c in checks:
        lines.append(f"{marks.get(c.status, '[ ?? ]')} {c.name}: {c.detail}")
        if c.fix and c.status in (WARN, FAIL):
            for i, text in enumerate(c.fix.splitlines()):
                lines.append(("       fix: " if i == 0 else "            ") + text)
    failed = [c for c in checks if c.failed]
    lines.append("")
    lines.append(
        f"{len(failed)} required check(s) failed: {', '.join(c.name for c in failed)}"
        if failed
        else "all required checks passed"
    )
    return "\n".join(lines)


def as_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) | {"failed": c.failed} for c in checks]


__all__ = [
    "CHECKS",
    "Check",
    "CheckFn",
    "Telemetry",
    "run_checks",
    "kueue_priority_boost_check",
    "kueue_feature_checks",
    "gate_admission_check_checks",
    "gate_queue_checks",
    "format_checks",
    "as_json",
]
