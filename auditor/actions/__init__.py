"""Side effects of policy decisions on Kubernetes: annotations, Events, requeue.

Each function here is one idempotent write: re-running it (after a crash between the write and
its record in the store) leaves the same state — annotations are merge patches of fixed values,
Events have names derived from the decision's dedup key (a second create gets 409), requeue
patches set ``spec.active``/``spec.suspend`` to a value rather than toggling it.
"""

from auditor.actions.kube import KubeActions, RequeueRefused

__all__ = ["KubeActions", "RequeueRefused"]
