"""Who the Kubernetes API says we are (a SelfSubjectReview): the name an acknowledgement records."""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.rest import ApiException

from auditor.kube.client import call_json, unavailable

REVIEW_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


def username(api: client.ApiClient) -> str:
    """The authenticated user name (``status.userInfo.username``), as RBAC and audit logs know it.

    SelfSubjectReview is GA since Kubernetes 1.28 and every authenticated user may create one.
    SourceUnavailable (retryable) when the API cannot be asked.
    """
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        doc = call_json(api, REVIEW_PATH, method="POST", body=body)
    except (ApiException, OSError) as exc:
        raise unavailable(exc, "ask the API who we are (SelfSubjectReview)") from exc
    name = ((doc.get("status") or {}).get("userInfo") or {}).get("username")
    if not name:
        raise unavailable(RuntimeError("no userInfo.username in the answer"), "ask the API who we are")
    return str(name)
