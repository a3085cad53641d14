"""The resolver's cache of owner objects (metadata only, by uid), filled from the API on first sight.

An owner's labels are trusted for :data:`OWNER_TTL` seconds and a missing owner is remembered
for :data:`MISSING_TTL`, so in steady state a cycle makes no API request. New (or stale) owners
come in bulk where there are many of a kind (:meth:`OwnerCache.prefetch`: one paged metadata list
of the kind, so a first sighting of 10,000 pods costs a few requests per owner kind, not one per
job); the rest cost one GET per level of the chain. Only the kinds of
:data:`auditor.core.kinds.BY_GROUP_KIND` are read (the operator's RBAC allows get and list of
exactly those).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from typing import TYPE_CHECKING, Callable, Iterable

from kubernetes import client
from kubernetes.client.rest import ApiException

from auditor.clock import SYSTEM_CLOCK
from auditor.core.identity import is_path_segment_name
from auditor.core.kinds import BY_GROUP_KIND
from auditor.kube.client import METADATA_ACCEPT, call_json, resource_path
from auditor.kube.jobview import OwnerMeta, OwnerRef, PodInfo, controller_of

if TYPE_CHECKING:
    from auditor.ports import Clock

log = logging.getLogger("auditor.kube.resolver")

OWNER_TTL = 600.0  # seconds an owner's labels are trusted before they are fetched again
MISSING_TTL = 60.0  # seconds a missing owner is remembered as missing
#: at least this many owners of one kind to fetch: one paged list of the kind instead of a GET each
LIST_AT = 8
PAGE = 500
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


class OwnerCache:
    """Owner metadata by uid over one ``ApiClient``; ``live_pod`` answers owner Pods (an LWS
    worker set's leader) from the pod informer instead of the API."""

    def __init__(
        self, api: client.ApiClient, live_pod: Callable[[str], PodInfo | None], clock: "Clock" = SYSTEM_CLOCK
    ) -> None:
        self.api = api
        #: the cached owners' ages are measured on it (a test's clock moves them past their TTL)
        self.clock = clock
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
        if not is_path_segment_name(ref.name):
            # an ownerReference's name is only required to be non-empty: one with a "/" or ".."
            # would be a path of its own in the GET; it ends the chain, and the resolver refuses
            # the job it then names (KubeResolver._checked)
            return None
        now = self.clock.monotonic()
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

    def prefetch(self, wanted: Iterable[tuple[str, OwnerRef]]) -> list[tuple[str, OwnerMeta]]:
        """Fill the cache for many owners at once; the metadata of those known afterwards.

        Owners of a kind the cache lacks (or holds stale) are fetched with one paged,
        metadata-only list of that kind across the cluster when there are at least
        :data:`LIST_AT` of them (a first sighting of a thousand Jobs costs two requests, not a
        thousand); fewer are left to :meth:`lookup`'s GET. An owner the list does not hold
        (deleted, or a new object under its name) is remembered as missing, as a GET's 404 is.
        A list that fails leaves its owners to :meth:`lookup`.
        """
        now = self.clock.monotonic()
        known: list[tuple[str, OwnerMeta]] = []
        todo: dict[tuple[str, str, str], dict[str, tuple[str, OwnerRef]]] = defaultdict(dict)
        with self._lock:
            for namespace, ref in wanted:
                cached = self._objects.get(ref.uid)
                if cached is not None and now - cached.fetched < (MISSING_TTL if cached.missing else OWNER_TTL):
                    if not cached.missing:
                        known.append((namespace, cached))
                    continue
                if ref.kind != "Pod" and (ref.group, ref.kind) in BY_GROUP_KIND:
                    todo[(ref.api_version, ref.group, ref.kind)][ref.uid] = (namespace, ref)
        for (api_version, group, kind), refs in sorted(todo.items()):
            if len(refs) < LIST_AT:
                continue
            found = self._list(api_version, BY_GROUP_KIND[(group, kind)].plural, refs)
            if found is None:
                continue
            with self._lock:
                if len(self._objects) + len(refs) > 50_000:
                    self._objects.clear()
                for uid, (namespace, ref) in refs.items():
                    meta = found.get(uid)
                    self._objects[uid] = meta or OwnerMeta(
                        ref.api_version, ref.kind, ref.name, ref.uid, {}, None, now, missing=True
                    )
                    if meta is not None:
                        known.append((namespace, meta))
        return known

    def _list(
        self, api_version: str, plural: str, refs: dict[str, tuple[str, OwnerRef]]
    ) -> dict[str, OwnerMeta] | None:
        """The wanted owners (by uid) among one paged metadata list of the kind; None on failure."""
        path = resource_path(api_version, plural)
        out: dict[str, OwnerMeta] = {}
        cont: str | None = None
        while True:
            query: list[tuple[str, object]] = [("limit", PAGE)]
            if cont:
                query.append(("continue", cont))
            self.requests += 1
            try:
                doc = call_json(self.api, path, query=query, accept=METADATA_LIST_ACCEPT, timeout=120)
            except ApiException as exc:
                log.info("cannot list %s (%s %s): owners are read one by one", plural, exc.status, exc.reason)
                return None
            except Exception as exc:  # noqa: BLE001 - a broken connection: lookups read them one by one
                log.info("cannot list %s (%s): owners are read one by one", plural, exc)
                return None
            fetched = self.clock.monotonic()
            for item in doc.get("items") or []:
                meta = item.get("metadata") or {}
                want = refs.get(meta.get("uid", ""))
                if want is None or want[1].name != meta.get("name") or want[0] != meta.get("namespace"):
                    continue
                ref = want[1]
                out[ref.uid] = OwnerMeta(
                    ref.api_version,
                    ref.kind,
                    ref.name,
                    ref.uid,
                    dict(meta.get("labels") or {}),
                    controller_of(meta),
                    fetched,
                )
            cont = (doc.get("metadata") or {}).get("continue")
            if not cont:
                return out

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
            self.clock.monotonic(),
        )
