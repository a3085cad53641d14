"""Which Kueue the cluster runs, and whether it acts on what gpu-auditor's options write.

:func:`kueue_findings` (doctor and the operator's start, through ``compose.kueue_findings``) says
the Kueue version (its Deployment's Helm label or image tag) and, for the options chosen, whether
the ``PriorityBoost`` (demotion) and ``AdmissionGatedBy`` (hold before quota) gates are on: read
from the Deployment's ``--feature-gates`` or the ``kueue-manager-config`` ConfigMap, else the
version's default (:data:`GATE_HISTORY`, from upstream's ``pkg/features/kube_features.go``).

PriorityBoost is also seen by its effect, which needs no right on Kueue's namespace: our requeue
lowers a job's priority by writing ``kueue.x-k8s.io/priority-boost`` on its Workload; Kueue
(v0.17.0 to v0.19.2) reads it only with its alpha ``PriorityBoost`` feature gate on (off by default:
``pkg/features/kube_features.go``; ``pkg/util/priority``: without the gate the boost is 0). The
gate is set in Kueue's manager configuration or flags, which the operator may not read; its
effect can be seen instead: with the gate on, Kueue's Workload validating webhook rejects a
boost that is not a signed integer (``pkg/webhooks/workload_webhook.go``: "must be a valid signed
integer"), without it the value is accepted. :func:`probe_priority_boost` sends such a patch as a
server-side dry run (``dryRun=All``: admission runs, nothing is stored) to one existing Workload:
the RBAC it needs is the requeue's (patch on workloads), and a cluster without Workloads cannot
say.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.rest import ApiException

from auditor.errors import AuditorError
from auditor.kube.client import call_json, preferred_version, resource_path

KUEUE_GROUP = "kueue.x-k8s.io"
PRIORITY_BOOST = "kueue.x-k8s.io/priority-boost"
#: a value Kueue's webhook refuses while the gate is on (it is not a signed integer)
_PROBE_VALUE = "gpu-auditor-probe"
ON, OFF, UNKNOWN = "on", "off", "unknown"


@dataclass(frozen=True, slots=True)
class GateProbe:
    """What the probe found: ``state`` (on, off, unknown) and how it knows, in one line."""

    state: str
    detail: str


def probe_priority_boost(api: client.ApiClient) -> GateProbe:
    """Whether Kueue's ``PriorityBoost`` gate is on, by a dry-run patch to one Workload."""
    try:
        gv = preferred_version(api, KUEUE_GROUP)
    except ApiException as exc:
        return GateProbe(UNKNOWN, f"cannot discover the {KUEUE_GROUP} API ({exc.status} {exc.reason})")
    if gv is None:
        return GateProbe(UNKNOWN, "Kueue is not installed (no kueue.x-k8s.io API)")
    try:
        items = call_json(api, resource_path(gv, "workloads"), query=[("limit", "1")]).get("items") or []
    except ApiException as exc:
        return GateProbe(UNKNOWN, f"cannot list Workloads ({exc.status} {exc.reason})")
    if not items:
        return GateProbe(UNKNOWN, "no Workload in the cluster to probe Kueue's webhook with")
    meta = items[0].get("metadata") or {}
    where = f"Workload {meta.get('namespace')}/{meta.get('name')}"
    try:
        call_json(
            api,
            resource_path(gv, "workloads", meta.get("namespace"), meta.get("name")),
            method="PATCH",
            query=[("dryRun", "All")],
            body={"metadata": {"annotations": {PRIORITY_BOOST: _PROBE_VALUE}}},
            content_type="application/merge-patch+json",
        )
    except ApiException as exc:
        body = str(exc.body or "")
        if "denied the request" in body and PRIORITY_BOOST in body:
            return GateProbe(ON, f"Kueue's webhook refused a non-integer {PRIORITY_BOOST} on {where} (dry run)")
        return GateProbe(UNKNOWN, f"dry-run patch of {where} failed ({exc.status} {exc.reason}); requeue RBAC needed")
    return GateProbe(OFF, f"Kueue's webhook accepted a non-integer {PRIORITY_BOOST} on {where} (dry run)")


# --- Which Kueue runs, and what the chosen options need of it (issue 29) --------------------------

PRIORITY_BOOST_GATE = "PriorityBoost"
ADMISSION_GATED_BY_GATE = "AdmissionGatedBy"
#: Where upstream installs Kueue: kustomize's ``kueue-`` prefix on ``config/components/manager``'s
#: ``controller-manager`` Deployment and ``manager-config`` ConfigMap; the Helm chart uses the same names.
KUEUE_NAMESPACE = "kueue-system"
KUEUE_DEPLOYMENT = "kueue-controller-manager"
KUEUE_CONFIGMAP = "kueue-manager-config"
KUEUE_CONFIG_KEY = "controller_manager_config.yaml"
#: The oldest Kueue gpu-auditor runs on, and the newest the test bed has run it on (the newest the Go
#: module proxy served on 2026-12-03; v0.19.3, v0.20.x and v0.21.x it refused).
KUEUE_FLOOR = (0, 17)
KUEUE_NEWEST_TESTED = (0, 19, 2)
#: Each gate's defaults by Kueue minor, from upstream ``pkg/features/kube_features.go`` (v0.17.0,
#: v0.19.2): (since, on by default, stage). PriorityBoost: alpha, off, in both. AdmissionGatedBy:
#: alpha and off in v0.17, beta and on from v0.19.
GATE_HISTORY: dict[str, tuple[tuple[tuple[int, int], bool, str], ...]] = {
    PRIORITY_BOOST_GATE: (((0, 17), False, "alpha"),),
    ADMISSION_GATED_BY_GATE: (((0, 17), False, "alpha"), ((0, 19), True, "beta")),
}
#: What each gate carries for gpu-auditor, said when it is off.
GATE_USE = {
    PRIORITY_BOOST_GATE: (
        "requeue.lowerPriorityBy (demotion) writes kueue.x-k8s.io/priority-boost, which Kueue ignores without it"
    ),
    ADMISSION_GATED_BY_GATE: (
        "gate.holdBeforeQuota adds kueue.x-k8s.io/admission-gated-by to Jobs, which Kueue ignores without it "
        "(the gate's AdmissionCheck still holds flagged lineages after quota is reserved)"
    ),
}
OK_LEVEL, WARN_LEVEL, INFO_LEVEL = "ok", "warn", "info"


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``v0.19.2`` (an image tag or a chart's appVersion; a suffix such as ``-rc.1`` ignored) →
    (0, 19, 2); None when the text is not such a version."""
    if not text:
        return None
    core = text.strip().lstrip("v").split("-", 1)[0].split("+", 1)[0]
    parts = core.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def gate_default(gate: str, version: tuple[int, ...]) -> tuple[bool, str] | None:
    """(on by default, stage) of a Kueue feature gate at a version; None when the gate is unknown
    or the version predates it."""
    found = None
    for since, default, stage in GATE_HISTORY.get(gate, ()):
        if tuple(version[:2]) >= since:
            found = (default, stage)
    return found


@dataclass(frozen=True, slots=True)
class KueueInstall:
    """What the cluster says about its Kueue: the version (None when it cannot be read) and the
    feature gates its configuration sets explicitly, each with where it was read."""

    version: str | None
    version_from: str
    gates: dict[str, bool]
    gates_from: str


@dataclass(frozen=True, slots=True)
class FeatureLine:
    """One finding: ``level`` (ok, warn, info), the ``subject`` it is about, and one line of text."""

    level: str
    subject: str
    text: str


def _image_tag(image: str) -> str | None:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def _flag_gates(args: list[str]) -> dict[str, bool] | None:
    """``--feature-gates=A=true,B=false`` from a container's command and args (None: no flag)."""
    for i, arg in enumerate(args):
        value = None
        if arg.startswith("--feature-gates="):
            value = arg.split("=", 1)[1]
        elif arg == "--feature-gates" and i + 1 < len(args):
            value = args[i + 1]
        if value is not None:
            out = {}
            for pair in value.split(","):
                key, _, val = pair.partition("=")
                if key.strip():
                    out[key.strip()] = val.strip().lower() == "true"
            return out
    return None


def install_from(deployment: dict | None, configmap: dict | None, where: str) -> KueueInstall:
    """The Kueue install read from its Deployment and manager ConfigMap (either may be None).

    The version is the Helm chart's ``app.kubernetes.io/version`` label, else the manager
    container's image tag. Kueue takes its gates from ``--feature-gates`` when that flag is given
    and from the configuration's ``featureGates`` otherwise (``cmd/kueue/main.go``), so the same
    order here.
    """
    import yaml

    version, version_from = None, f"no Deployment {where}/{KUEUE_DEPLOYMENT} readable"
    flags = None
    if deployment is not None:
        labels = (deployment.get("metadata") or {}).get("labels") or {}
        containers = ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
        manager = next((c for c in containers if c.get("name") == "manager"), containers[0] if containers else {})
        tag = _image_tag(str(manager.get("image") or ""))
        if parse_version(labels.get("app.kubernetes.io/version")):
            version = labels["app.kubernetes.io/version"]
            version_from = f"label app.kubernetes.io/version of Deployment {where}/{KUEUE_DEPLOYMENT}"
        elif parse_version(tag):
            version = tag
            version_from = f"image {manager.get('image')} of Deployment {where}/{KUEUE_DEPLOYMENT}"
        else:
            version_from = f"neither a version label nor a version tag on Deployment {where}/{KUEUE_DEPLOYMENT}"
        flags = _flag_gates([str(a) for a in (manager.get("command") or []) + (manager.get("args") or [])])
    if flags is not None:
        return KueueInstall(version, version_from, flags, f"--feature-gates of Deployment {where}/{KUEUE_DEPLOYMENT}")
    if configmap is None:
        return KueueInstall(version, version_from, {}, f"no ConfigMap {where}/{KUEUE_CONFIGMAP} readable")
    try:
        cfg = yaml.safe_load(((configmap.get("data") or {}).get(KUEUE_CONFIG_KEY)) or "") or {}
    except yaml.YAMLError:
        cfg = {}
    gates = cfg.get("featureGates") if isinstance(cfg, dict) else None
    explicit = {str(k): bool(v) for k, v in (gates or {}).items()} if isinstance(gates, dict) else {}
    return KueueInstall(version, version_from, explicit, f"featureGates of ConfigMap {where}/{KUEUE_CONFIGMAP}")


def feature_lines(install: KueueInstall, needs: tuple[str, ...], boost: GateProbe | None = None) -> list[FeatureLine]:
    """What still works on this Kueue for the options chosen (``needs``: the gates they rest on).

    A gate's state is, first, what Kueue's webhook showed (``boost``, PriorityBoost only), then the
    configuration's explicit setting, then the version's default. Pure: the doctor and the
    operator's start both print these lines.
    """
    lines: list[FeatureLine] = []
    ver = parse_version(install.version)
    if ver is None:
        lines.append(FeatureLine(INFO_LEVEL, "Kueue version", f"unknown ({install.version_from})"))
    elif ver[:2] < KUEUE_FLOOR:
        lines.append(
            FeatureLine(
                WARN_LEVEL,
                "Kueue version",
                f"{install.version} ({install.version_from}) is older than gpu-auditor's floor "
                f"v{KUEUE_FLOOR[0]}.{KUEUE_FLOOR[1]}.0: the Workload API (kueue.x-k8s.io/v1beta2) and the gates "
                "below may be missing",
            )
        )
    elif ver > KUEUE_NEWEST_TESTED:
        newest = ".".join(map(str, KUEUE_NEWEST_TESTED))
        lines.append(
            FeatureLine(
                INFO_LEVEL,
                "Kueue version",
                f"{install.version} ({install.version_from}); gpu-auditor was tested on v0.17.0 and v{newest}",
            )
        )
    else:
        lines.append(FeatureLine(OK_LEVEL, "Kueue version", f"{install.version} ({install.version_from})"))
    for gate in needs:
        lines.append(_gate_line(gate, install, ver, boost if gate == PRIORITY_BOOST_GATE else None))
    return lines


def _gate_line(
    gate: str, install: KueueInstall, ver: tuple[int, int, int] | None, probe: GateProbe | None
) -> FeatureLine:
    subject = f"Kueue {gate} gate"
    known = gate_default(gate, ver) if ver else None
    stage = f"{known[1]} in {install.version}" if known else "stage unknown"
    use = GATE_USE.get(gate, "")
    if probe is not None and probe.state in (ON, OFF):
        on, how = probe.state == ON, probe.detail
    elif gate in install.gates:
        on, how = install.gates[gate], f"set in {install.gates_from}"
    elif known is not None:
        on, how = known[0], f"{install.version}'s default ({install.gates_from} does not set it)"
    else:
        return FeatureLine(INFO_LEVEL, subject, f"unknown ({install.gates_from}; {install.version_from}); {use}")
    if not on:
        return FeatureLine(WARN_LEVEL, subject, f"off ({how}; {stage}): {use}")
    note = ""
    if known and known[1] == "alpha":
        note = "; alpha: Kueue may change or drop it in a later release"
    if gate == PRIORITY_BOOST_GATE:
        note += (
            "; the annotation is read up to v0.19.2 at least, and kubernetes-sigs/kueue#13414 proposes a "
            "Workload field (spec.priorityBoost) in its place"
        )
    return FeatureLine(OK_LEVEL, subject, f"on ({how}; {stage}){note}")


def read_install(api: client.ApiClient, namespace: str = KUEUE_NAMESPACE) -> KueueInstall:
    """Kueue's Deployment and manager ConfigMap in ``namespace``, each None when absent or not
    readable (the operator's RBAC may not reach Kueue's namespace: that is not an error)."""

    def get(path: str) -> dict | None:
        try:
            return call_json(api, path)
        except ApiException:
            return None

    deployment = get(resource_path("apps/v1", "deployments", namespace, KUEUE_DEPLOYMENT))
    configmap = get(resource_path("v1", "configmaps", namespace, KUEUE_CONFIGMAP))
    return install_from(deployment, configmap, namespace)


def kueue_findings(
    api: client.ApiClient, *, needs: tuple[str, ...], namespace: str = KUEUE_NAMESPACE
) -> list[FeatureLine]:
    """The Kueue version and the feature gates that ``needs`` names, as one line each.

    For ``doctor`` and the operator's start: ``needs`` holds :data:`PRIORITY_BOOST_GATE` when
    ``requeue.lowerPriorityBy`` is set and :data:`ADMISSION_GATED_BY_GATE` when
    ``gate.holdBeforeQuota`` is on (:func:`needed_gates`). Reads Kueue's Deployment and ConfigMap
    (get on both in ``namespace``; without the right the lines say unknown) and, for PriorityBoost,
    probes Kueue's webhook by a dry-run patch, which sees the gate as Kueue runs it.
    """
    boost = None
    if PRIORITY_BOOST_GATE in needs:
        try:
            boost = probe_priority_boost(api)
        except AuditorError as exc:  # a dry run's client refuses even a dry-run patch: WriteRefused
            boost = GateProbe(UNKNOWN, f"not probed: {exc}")
    return feature_lines(read_install(api, namespace), needs, boost)


def needed_gates(*, lower_priority: bool, hold_before_quota: bool) -> tuple[str, ...]:
    """The Kueue feature gates the chosen options rest on."""
    return tuple(
        g for g, used in ((PRIORITY_BOOST_GATE, lower_priority), (ADMISSION_GATED_BY_GATE, hold_before_quota)) if used
    )
