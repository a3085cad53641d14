"""Record Kueue's admission facts of the jobs an audit wrote (the operator's cycle, ``audit --kubeconfig``).

The use-case between the resolver's Workload cache (:mod:`auditor.kube.kueue_facts`) and the
store (:mod:`auditor.store.admissions`): after the summaries of a cycle are saved, each of those
jobs with a Kueue Workload gets its reading folded into its stored facts.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from auditor.core.identity import JobKey
from auditor.kube.kueue_facts import facts_by_job
from auditor.ports import OperatorStore

if TYPE_CHECKING:
    from auditor.store.store import Store


def record_admissions(
    store: OperatorStore, resolver: Any, view: Mapping[str, Any], job_ids: Mapping[str, int], now: datetime
) -> int:
    """Store the admission facts of the jobs ``job_ids`` (job key → store id) found in ``view``.

    ``resolver`` is a :class:`~auditor.kube.resolver.KubeResolver` or a shard's view of one
    (:class:`~auditor.operator_loop.shards.ShardResolver`); without Kueue's Workloads nothing is
    recorded. Returns the number of jobs whose stored facts changed.
    """
    facts = facts_by_job(resolver, view)
    readings = [(job_ids[k], f) for k, f in facts.items() if k in job_ids]
    return store.record_admission_facts(readings, now)


def record_audit_admissions(
    store: "Store", resolver: Any, summaries: Iterable[Mapping[str, Any]], now: datetime
) -> int:
    """``audit`` with the Kubernetes API: the admission facts of the jobs it summarized.

    The job ids come from the store (the audit just wrote those jobs); the Workloads from the
    resolver's informer, as in the operator's cycle.
    """
    if resolver.workloads is None:  # Kueue is off or not installed
        return 0
    view = resolver.jobs(now)
    ids: dict[str, int] = {}
    for s in summaries:
        job = JobKey.of_document(s)
        key = str(job)
        if key in view:
            found = store.find_job(job.namespace, job.kind, job.name, job.cluster)
            if found is not None:
                ids[key] = found[0]
    return record_admissions(store, resolver, view, ids, now)
