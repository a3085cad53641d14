"""The policy ladder's requeue through the gate's AdmissionCheck (the port
:class:`auditor.ports.CheckRequeue`), issue 16 item 6.

A requeue by ``spec.active`` puts a running job behind the others too, but gpu-auditor then owns
the backoff and the reactivation, and Kueue counts a deactivation, not a retry. Through the check
(:meth:`GateController.requeue`: ``Retry``, then ``Retry`` with ``requeueAfterSeconds``) Kueue
evicts the job, keeps it out of the queue for the backoff, queues it again behind the Workloads
that waited and counts the retry (``retryCount``); nothing is left for gpu-auditor to undo. It
is used only where it makes a difference and can work: the gate's controller runs in this replica
(it writes the second ``Retry`` when Kueue marks the Workload ``Evicted``), its check is on the
Workload (its ClusterQueue runs the check for the Workload's flavor), the Workload is admitted,
and its ClusterQueue has Workloads pending. Anything else is answered ``used: False`` with the
reason, and the ladder takes the ``spec.active`` path.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Callable, Mapping

from auditor.errors import AuditorError
from auditor.gate.controller import GateController
from auditor.gate.kueue import WorkloadView

log = logging.getLogger(__name__)

#: Kueue's ``requeueAfterSeconds`` is whole seconds; 0 would be the plain ``Retry``, which Kueue
#: v0.17 re-admits ahead of the waiting Workloads
_MIN_BACKOFF_S = 1


class GateRequeue:
    """:class:`auditor.ports.CheckRequeue` on the gate's controller of this replica
    (``controller()``: None while it does not run, e.g. on a standby or another shard)."""

    def __init__(self, controller: Callable[[], GateController | None]) -> None:
        self.controller = controller

    def requeue(
        self, workload: Mapping[str, Any], message: str, *, backoff_s: int, lower_priority_by: int, now: datetime
    ) -> dict:
        ctl = self.controller()
        if ctl is None:
            return {"used": False, "why": "the efficiency gate does not run in this replica"}
        ns, name = str(workload["namespace"]), str(workload["name"])
        obj = ctl.kube.workload(ns, name)
        if obj is None:
            return {"used": False, "why": f"Workload {ns}/{name} is gone"}
        view = WorkloadView.parse(obj)
        ours = sorted(n for n in view.checks if n in ctl.check_names)
        if not ours:
            return {
                "used": False,
                "why": f"the gate's AdmissionCheck is not on Workload {ns}/{name} "
                f"(its ClusterQueue {view.cluster_queue or '?'} does not run it for this Workload's flavors)",
            }
        if not view.admitted or view.finished:
            return {"used": False, "why": f"Workload {ns}/{name} is not admitted"}
        pending = ctl.kube.pending_workloads(view.cluster_queue)
        if pending is None:
            return {"used": False, "why": f"cannot read ClusterQueue {view.cluster_queue}"}
        if pending == 0:
            return {"used": False, "why": f"no Workload waits in ClusterQueue {view.cluster_queue}"}
        backoff = max(_MIN_BACKOFF_S, int(backoff_s))
        # the check's lastTransitionTime from the controller's clock put on the API server's, not
        # the ladder's ``now`` (a cycle's time): Kueue evicts at lastTransitionTime +
        # requeueAfterSeconds, so a time ahead of the server's would hold the eviction back
        done = ctl.requeue(ns, name, message, backoff=backoff, current=obj)
        if done is None:  # not admitted any more between the two reads
            return {"used": False, "why": f"Workload {ns}/{name} is not admitted"}
        extra: dict[str, Any] = {}
        if lower_priority_by:
            # after the eviction is asked for, before Kueue queues it again (it reads the priority then)
            try:
                extra = ctl.kube.actions.lower_priority(workload, lower_priority_by)
            except AuditorError as exc:
                extra = {"priority_error": str(exc)}
                log.warning("requeue of %s/%s: priority not lowered: %s", ns, name, exc)
        log.info(
            "requeue of %s/%s through the AdmissionCheck %s: %d Workload(s) wait in ClusterQueue %s",
            ns,
            name,
            ", ".join(ours),
            pending,
            view.cluster_queue,
        )
        done["check_state"] = done.pop("state")  # the ladder's row has a state of its own
        return {"used": True, **done, "cluster_queue": view.cluster_queue, "pending_workloads": pending, **extra}
