"""Connecting to the API server: kubeconfig or in-cluster, optional impersonation, raw JSON calls.

The adapter works on plain JSON (dicts) rather than the client's generated model classes:
deserializing thousands of pods into models costs more than the rest of discovery, and the
custom resources (Kueue, Kubeflow, Ray, ...) have no models anyway.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Callable
from urllib.parse import urlsplit

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from auditor.errors import AuditorError, BadInput, SourceUnavailable

log = logging.getLogger(__name__)

#: Ask for metadata only (PartialObjectMetadata): owners need labels and ownerReferences, not
#: their (sometimes large) pod templates.
METADATA_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and who we are."""

    kubeconfig: str | None = None
    in_cluster: bool = False
    context: str | None = None
    #: act as this user, e.g. ``system:serviceaccount:NS:NAME`` (the apiserver adds a service
    #: account's groups itself); for proving least privilege
    impersonate: str | None = None


def api_client(cfg: KubeConfig) -> client.ApiClient:
    """An ApiClient for ``cfg`` (BadInput when the kubeconfig cannot be loaded)."""
    conf = client.Configuration()
    try:
        if cfg.in_cluster:
            config.load_incluster_config(client_configuration=conf)
        else:
            config.load_kube_config(config_file=cfg.kubeconfig, context=cfg.context, client_configuration=conf)
    except (config.ConfigException, OSError, TypeError) as exc:
        where = "in-cluster service account" if cfg.in_cluster else f"kubeconfig {cfg.kubeconfig or '(default)'}"
        raise BadInput(f"cannot load the {where}: {exc}") from None
    api = client.ApiClient(conf)
    if cfg.impersonate:
        api.set_default_header("Impersonate-User", cfg.impersonate)
    return _connection_errors_mapped(api)


def _connection_errors_mapped(api: client.ApiClient) -> client.ApiClient:
    """Make a connection failure of any request (typed clients, raw JSON calls, the start of a
    watch) our retryable :class:`SourceUnavailable` naming the API server, in place: urllib3's
    own exceptions reached the user as a 40-line traceback."""
    inner = api.call_api
    host = api.configuration.host

    def call_api(*args: Any, **kwargs: Any) -> Any:
        try:
            return inner(*args, **kwargs)
        except urllib3.exceptions.HTTPError as exc:
            raise SourceUnavailable(f"Kubernetes API at {host}: {connection_reason(exc)}") from exc

    api.call_api = call_api  # type: ignore[method-assign]
    return api


def connection_reason(exc: BaseException) -> str:
    """What went wrong on the way to the API server, in a few words."""
    reason = getattr(exc, "reason", None) or exc
    text = str(reason)
    for known in ("Connection refused", "Name or service not known", "No route to host", "Network is unreachable"):
        if known in text:
            return f"unreachable: {known}"
    if isinstance(reason, urllib3.exceptions.NameResolutionError):
        return "unreachable: its name does not resolve"
    if isinstance(reason, urllib3.exceptions.ReadTimeoutError):
        return "did not answer in time"
    if isinstance(reason, urllib3.exceptions.ConnectTimeoutError):  # NewConnectionError is one too
        return "unreachable: the connection timed out"
    if isinstance(reason, urllib3.exceptions.SSLError):
        return f"TLS failed: {reason}"
    return f"unreachable: {type(reason).__name__}"


def check_reachable(api: client.ApiClient, timeout: float = 10.0) -> None:
    """GET ``/version``: one quick request that fails in one line (:class:`SourceUnavailable`)
    before any watch starts, so an unreachable API server is said once, not by every thread."""
    try:
        call_json(api, "/version", timeout=timeout)
    except ApiException as exc:
        if exc.status in (401, 403):  # reachable; what we may do is checked by the calls that need it
            return
        raise unavailable(exc, "GET /version") from None


class WriteRefused(AuditorError):
    """A read-only client (``run --dry-run``) was asked to change something on the cluster."""


def read_only(api: client.ApiClient) -> client.ApiClient:
    """Make ``api`` refuse every request but GET and HEAD, in place (and return it).

    A dry run decides not to write; this makes sure nothing it calls can, whatever the path
    (typed clients, raw JSON calls and watches all go through ``call_api``).
    """
    inner = api.call_api

    def call_api(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if str(method).upper() not in ("GET", "HEAD"):
            raise WriteRefused(f"dry run: refused {method} {urlsplit(url).path} (nothing is written to the cluster)")
        return inner(method, url, *args, **kwargs)

    api.call_api = call_api  # type: ignore[method-assign]
    return api


def call_json(
    api: client.ApiClient,
    path: str,
    *,
    method: str = "GET",
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    accept: str = "application/json",
    content_type: str = "application/json",
    timeout: float = 30.0,
) -> dict:
    """One API request, the response body as a dict. Raises :class:`ApiException` on HTTP errors."""
    resp = raw_request(
        api, path, method=method, query=query, body=body, accept=accept, content_type=content_type, timeout=timeout
    )
    try:
        data = resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=resp.reason, body=data.decode("utf-8", "replace"))
    finally:
        resp.release_conn()
    return json.loads(data) if data else {}


def raw_request(
    api: client.ApiClient,
    path: str,
    *,
    method: str = "GET",
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    accept: str = "application/json",
    content_type: str = "application/json",
    timeout: float | tuple | None = 30.0,
) -> Any:
    """The request as the generated client makes it (auth, default headers such as
    impersonation), returning the unread ``urllib3`` response (watches stream from it)."""
    headers = {"Accept": accept}
    if body is not None:
        headers["Content-Type"] = content_type
    m, url, hdrs, body_, post = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=query or [],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    rest = api.call_api(m, url, header_params=hdrs, body=body_, post_params=post, _request_timeout=timeout)
    return rest.response


def server_clock_offset(api: client.ApiClient, clock: Callable[[], datetime]) -> timedelta:
    """How far the API server's clock is ahead of ``clock`` (negative: behind), from the ``Date``
    header of one ``/version`` request.

    Timestamps that the cluster writes (a Workload's ``QuotaReserved`` time, set by Kueue) are in
    the control plane's clock; comparing them with this process's clock is only right once the
    two are put on one clock. ``Date`` has whole seconds, so the offset is good to about half a
    second plus the round trip; an answer without the header (or no answer) says 0, logged.
    """
    t0 = clock()
    try:
        resp = raw_request(api, "/version", timeout=10.0)
        try:
            date = resp.headers.get("Date")
        finally:
            resp.release_conn()
        t1 = clock()
        server = parsedate_to_datetime(date) if date else None
    except Exception as exc:  # noqa: BLE001 - the offset is a correction, not a requirement
        log.warning("cannot read the API server's clock (%s); taking it to agree with ours", connection_reason(exc))
        return timedelta(0)
    if server is None:
        log.warning("the API server's answer has no Date header; taking its clock to agree with ours")
        return timedelta(0)
    # the header is truncated to the second: its middle, against the middle of our request
    return server + timedelta(milliseconds=500) - (t0 + (t1 - t0) / 2)


def resource_path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    """``/api/v1/...`` for the core group, ``/apis/GROUP/VERSION/...`` otherwise."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    if name:
        base += f"/{name}"
    return base


def preferred_version(api: client.ApiClient, group: str) -> str | None:
    """The server's preferred ``group/version`` for an API group, None when it is not served."""
    try:
        doc = call_json(api, f"/apis/{group}")
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    pv = doc.get("preferredVersion") or {}
    return pv.get("groupVersion")


def served_resources(api: client.ApiClient, group_version: str) -> set[str]:
    """The resource names (plurals) one group/version serves; empty when not served."""
    path = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    try:
        doc = call_json(api, path)
    except ApiException as exc:
        if exc.status == 404:
            return set()
        raise
    return {r["name"] for r in doc.get("resources", []) if "/" not in r["name"]}


def unavailable(exc: Exception, what: str) -> SourceUnavailable:
    """An API failure as our retryable error, naming what we were doing."""
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None) or str(exc)
    return SourceUnavailable(f"Kubernetes API: {what} failed: {status or ''} {reason}".strip())
