"""The one Kubernetes adapter: discovery of GPU pods, owner resolution, Kueue, teams, the Lease.

Everything the project does against the Kubernetes API goes through this package, so RBAC
(``auditor/permissions.yaml``) and the code can be checked against each other in one place.
"""

from auditor.kube.client import KubeConfig, api_client
from auditor.kube.lease import LeaderElector
from auditor.kube.resolver import JobInfo, KubeResolver

__all__ = ["JobInfo", "KubeConfig", "KubeResolver", "LeaderElector", "api_client"]
