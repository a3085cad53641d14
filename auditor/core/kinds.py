"""The Kubernetes kinds of jobs we read and write: one table for the resolver and the actions.

The resolver follows owner chains through these kinds (GET of metadata) and the actions patch
them (annotate, suspend); both address an object generically by group, version and resource,
so a kind is added here once (with its RBAC in ``auditor/permissions.yaml``, which a test
checks against this table). An owner of a kind not listed ends the chain and is itself the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True, slots=True)
class JobKind:
    """A kind of object that can own GPU pods (or be one): where the API serves it."""

    kind: str
    group: str  # "" for the core API
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str, name: str | None = None) -> str:
        """The object's (or with no ``name``, the namespace's collection's) API path."""
        base = f"/api/{self.version}" if self.group == "" else f"/apis/{self.group}/{self.version}"
        return f"{base}/namespaces/{namespace}/{self.plural}" + (f"/{name}" if name else "")


_TABLE = (
    JobKind("Pod", "", "v1", "pods"),
    JobKind("Job", "batch", "v1", "jobs"),
    JobKind("CronJob", "batch", "v1", "cronjobs"),
    JobKind("ReplicaSet", "apps", "v1", "replicasets"),
    JobKind("Deployment", "apps", "v1", "deployments"),
    JobKind("StatefulSet", "apps", "v1", "statefulsets"),
    JobKind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets"),
    JobKind("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs"),
    JobKind("MPIJob", "kubeflow.org", "v1", "mpijobs"),
    JobKind("TFJob", "kubeflow.org", "v1", "tfjobs"),
    JobKind("XGBoostJob", "kubeflow.org", "v1", "xgboostjobs"),
    JobKind("PaddleJob", "kubeflow.org", "v1", "paddlejobs"),
    JobKind("JAXJob", "kubeflow.org", "v1", "jaxjobs"),
    JobKind("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs"),
    JobKind("RayJob", "ray.io", "v1", "rayjobs"),
    JobKind("RayCluster", "ray.io", "v1", "rayclusters"),
    JobKind("LeaderWorkerSet", "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
)

#: kind → where it is served (the actions address a job by its kind alone)
JOB_KINDS: Mapping[str, JobKind] = MappingProxyType({k.kind: k for k in _TABLE})
#: (API group, kind) → the same (owner references name a kind with its group and version)
BY_GROUP_KIND: Mapping[tuple[str, str], JobKind] = MappingProxyType({(k.group, k.kind): k for k in _TABLE})

KUEUE_GROUP = "kueue.x-k8s.io"
#: label Kueue puts on a Workload: the uid of the job it admits
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
#: label on a job naming its LocalQueue
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
