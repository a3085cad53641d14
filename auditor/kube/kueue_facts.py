"""Kueue's admission facts of the audited jobs, from the resolver's Workload informer.

The resolver already watches Workloads to find each job's own (by the ``kueue.x-k8s.io/job-uid``
label and owner uids); its informer keeps, per Workload, the facts
:func:`auditor.core.admission.admission_facts` reads (:func:`workload_facts` is its transform), so
reading them costs no API request. A Workload whose times cannot be read is logged and skipped:
one odd object must not stop a cycle.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Mapping

from auditor.core.admission import AdmissionFacts, admission_facts
from auditor.errors import BadInput

if TYPE_CHECKING:
    from auditor.kube.resolver import JobInfo, KubeResolver

log = logging.getLogger(__name__)


def workload_facts(workload: dict) -> AdmissionFacts | None:
    """The admission facts of one Workload from the API (None, logged, when unreadable)."""
    try:
        return admission_facts(workload)
    except BadInput as exc:
        log.warning("Kueue admission facts not recorded: %s", exc)
        return None


def facts_by_job(resolver: "KubeResolver", view: Mapping[str, "JobInfo"]) -> dict[str, AdmissionFacts]:
    """The admission facts of each job of ``view`` (the resolver's ``jobs()``) that has a Workload."""
    if resolver.workloads is None:
        return {}
    out: dict[str, AdmissionFacts] = {}
    for key, info in view.items():
        if not info.workload:
            continue
        wl = resolver.workloads.get(f"{info.ref.namespace}/{info.workload}")
        facts = (wl or {}).get("admission")
        if facts is not None:
            out[key] = facts
    return out
