"""The resolver's cache of owner objects (metadata only, by uid), filled from the API on first sight.

An owner's labels are trusted for :data:`OWNER_TTL` seconds and a missing owner is remembered
for :data:`MISSING_TTL`, so in steady state a cycle makes no API request; a new job costs one
GET per level of its owner chain. Only the kinds of :data:`auditor.core.kinds.BY_GROUP_KIND`
are fetched (the operator's RBAC allows exactly those).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

from auditor.core.kinds import BY_GROUP_KIND
from auditor.kube.client import METADATA_ACCEPT, call_json, resource_path
from auditor.kube.jobview import OwnerMeta, OwnerRef, PodInfo, controller_of

log = logging.getLogger("auditor.kube.resolver")

OWNER_TTL = 600.0  # seconds an owner's labels are trusted before they are fetched again
MISSING_TTL = 60.0  # seconds a missing owner is remembered as missing


class OwnerCache:
    """Owner metadata by uid over one ``ApiClient``; ``live_pod`` answers owner Pods (an LWS
    worker set's leader) from the pod informer instead of the API."""

    def __init__(self, api: client.ApiClient, live_pod: Callable[[str], PodInfo | None]) -> None:
        self.api = api
        self._live_pod = live_pod
        self._lock = threading.Lock()
        self._objects: dict[str, OwnerMeta] = {}
        self._warned: set[str] = set()
        #: owner GETs made (for /metrics and the benchmark)
        self.requests = 0

    def lookup(self, namespace: str, ref: OwnerRef) -> OwnerMeta | None:
        """The owner's metadata (cached by uid), None when it cannot be had."""
        known = BY_GROUP_KIND.get((ref.group, ref.kind))
        if known is None:
            return None  # a kind we do not follow (and may not read): it is the job
        now = time.monotonic()
        with self._lock:
            cached = self._objects.get(ref.uid)
        if cached is not None and now - cached.fetched < (MISSING_TTL if cached.missing else OWNER_TTL):
            return None if cached.missing else cached
        if ref.kind == "Pod":
            live = self._live_pod(f"{namespace}/{ref.name}")
            if live is not None and live.uid == ref.uid:
                return OwnerMeta("v1", "Pod", live.name, live.uid, live.labels, live.owner, now)
        obj = self._fetch(namespace, ref, known.plural)
        with self._lock:
            if len(self._objects) > 50_000:
                self._objects.clear()
            self._objects[ref.uid] = obj or OwnerMeta(
                ref.api_version, ref.kind, ref.name, ref.uid, {}, None, now, missing=True
            )
        return obj

    def _fetch(self, namespace: str, ref: OwnerRef, plural: str) -> OwnerMeta | None:
        path = resource_path(ref.api_version, plural, namespace, ref.name)
        self.requests += 1
        try:
            doc = call_json(self.api, path, accept=METADATA_ACCEPT)
        except ApiException as exc:
            if exc.status == 404:
                log.debug(
                    "owner %s %s/%s not found (deleted, or its CRD is not installed)", ref.kind, namespace, ref.name
                )
            elif exc.status == 403:
                if ref.kind not in self._warned:
                    self._warned.add(ref.kind)
                    log.warning(
                        "Forbidden to read %s objects: %s is taken as the job (check the RBAC)", ref.kind, ref.kind
                    )
            else:
                log.warning("cannot read owner %s %s/%s: %s %s", ref.kind, namespace, ref.name, exc.status, exc.reason)
            return None
        except Exception as exc:  # noqa: BLE001 - a broken connection: the ref is the job for now
            log.warning("cannot read owner %s %s/%s: %s", ref.kind, namespace, ref.name, exc)
            return None
        meta = doc.get("metadata") or {}
        if ref.uid and meta.get("uid") and meta["uid"] != ref.uid:
            return None  # a new object under the old name: not this pod's owner
        return OwnerMeta(
            ref.api_version,
            ref.kind,
            ref.name,
            meta.get("uid", ref.uid),
            dict(meta.get("labels") or {}),
            controller_of(meta),
            time.monotonic(),
        )
