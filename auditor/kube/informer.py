"""A small informer: list once, then watch, keeping a local cache of (transformed) objects.

The operator must not relist the cluster every cycle (issue 4): each informer lists its resource
once (in pages), then follows a watch from the list's resourceVersion with bookmarks, and relists
only when the watch expires (410 Gone) or the connection breaks. The cache holds what
``transform`` keeps of each object (for pods: only GPU pods, a few fields), so memory follows the
GPU workload, not the cluster. ``kubernetes.watch.Watch`` does the streaming; this class adds
the list, the relist-on-expiry, the cache and a thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Generic, TypeVar

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from auditor.kube.client import call_json, raw_request, resource_path

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a single watch request stays open before it is renewed (the server may end it sooner).
WATCH_SECONDS = 240
PAGE = 500


class Informer(Generic[T]):
    """List+watch one resource cluster-wide into a dict ``namespace/name → transform(obj)``.

    ``transform`` returns None for objects not worth keeping (they are dropped from the cache,
    as if deleted). ``on_delete(key, last_value)`` is called for kept objects that go away.
    ``absent`` is True when the resource is not served (its CRD is not installed): the
    informer then stays empty and looks again every ``recheck`` seconds, quietly.
    """

    def __init__(
        self,
        api: client.ApiClient,
        api_version: str,
        plural: str,
        transform: Callable[[dict], T | None],
        *,
        on_delete: Callable[[str, T], None] | None = None,
        name: str | None = None,
        recheck: float = 300.0,
    ) -> None:
        self.api = api
        self.api_version = api_version
        self.plural = plural
        self.transform = transform
        self.on_delete = on_delete
        self.name = name or plural
        self.recheck = recheck
        self._items: dict[str, T] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: watch.Watch | None = None
        self.absent = False
        self.forbidden = False
        self.last_error: str | None = None
        #: API requests made (lists, pages and watch requests), for the benchmark and /metrics
        self.requests = 0
        self.lists = 0
        #: changes of the cache so far (a list, an applied event): equal numbers, equal contents
        self.version = 0

    # ------------------------------------------------------------------ public

    def start(self) -> "Informer[T]":
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def items(self) -> dict[str, T]:
        """A snapshot of the cache."""
        with self._lock:
            return dict(self._items)

    def snapshot(self) -> tuple[int, dict[str, T]]:
        """:attr:`version` and a snapshot of the cache, taken together."""
        with self._lock:
            return self.version, dict(self._items)

    def get(self, key: str) -> T | None:
        with self._lock:
            return self._items.get(key)

    # ------------------------------------------------------------------ loop

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                rv = self._list()
                backoff = 1.0
                if rv is None:  # not served
                    self._stop.wait(self.recheck)
                    continue
                self._follow(rv)
            except ApiException as exc:
                if exc.status == 410:
                    log.debug("%s: watch expired, relisting", self.name)
                    continue
                self.last_error = f"{exc.status} {exc.reason}"
                if exc.status == 403:
                    if not self.forbidden:
                        log.error(
                            "%s: Forbidden: the operator's RBAC does not allow list/watch %s (%s)",
                            self.name,
                            self.plural,
                            exc.reason,
                        )
                    self.forbidden = True
                    self._synced.set()  # nothing to wait for; readiness reports it
                else:
                    log.warning("%s: %s %s; retrying in %.0f s", self.name, exc.status, exc.reason, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 60.0)
            except Exception as exc:  # noqa: BLE001 - a broken connection must not end the informer
                if self._stop.is_set():
                    break
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("%s: %s; retrying in %.0f s", self.name, self.last_error, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 60.0)

    def _list(self) -> str | None:
        """Replace the cache with a fresh paged list; return its resourceVersion (None: not served)."""
        path = resource_path(self.api_version, self.plural)
        fresh: dict[str, T] = {}
        cont: str | None = None
        rv = ""
        while True:
            q: list[tuple[str, Any]] = [("limit", PAGE)]
            if cont:
                q.append(("continue", cont))
            try:
                self.requests += 1
                doc = call_json(self.api, path, query=q, timeout=120)
            except ApiException as exc:
                if exc.status == 404:
                    if not self.absent:
                        log.info(
                            "%s: %s/%s is not served (CRD not installed); skipping it",
                            self.name,
                            self.api_version,
                            self.plural,
                        )
                    self.absent = True
                    with self._lock:
                        old, self._items = self._items, {}
                        self.version += 1
                    self._notify_deleted(old)
                    self._synced.set()
                    return None
                if exc.status == 410 and cont:  # the continue token expired: start over
                    fresh, cont = {}, None
                    continue
                raise
            for obj in doc.get("items") or []:
                key = _key(obj)
                value = self.transform(obj)
                if value is not None:
                    fresh[key] = value
            meta = doc.get("metadata") or {}
            rv = meta.get("resourceVersion") or rv
            cont = meta.get("continue")
            if not cont:
                break
        self.lists += 1
        self.absent = False
        self.forbidden = False
        with self._lock:
            old, self._items = self._items, fresh
            self.version += 1
        self._notify_deleted({k: v for k, v in old.items() if k not in fresh})
        self._synced.set()
        return rv

    def _notify_deleted(self, gone: dict[str, T]) -> None:
        if self.on_delete:
            for k, v in gone.items():
                self.on_delete(k, v)

    def _follow(self, rv: str) -> None:
        """Watch from ``rv`` until stopped; returns to relist on 410 (raised) or error."""
        func = _list_function(self.api, self.api_version, self.plural)
        while not self._stop.is_set():
            w = watch.Watch()
            self._watch = w
            self.requests += 1
            for event in _events(
                w.stream(
                    func,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_SECONDS,
                    _request_timeout=WATCH_SECONDS + 30,
                    deserialize=False,
                )
            ):
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code")
                    raise ApiException(status=code, reason=f"{obj.get('reason')}: {obj.get('message')}")
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if new_rv:
                    rv = new_rv
                if kind == "BOOKMARK":
                    continue
                self._apply(kind, obj)
                if self._stop.is_set():
                    w.stop()
                    break
            self._watch = None

    def _apply(self, kind: str | None, obj: dict) -> None:
        key = _key(obj)
        if kind == "DELETED":
            with self._lock:
                old = self._items.pop(key, None)
                self.version += 1
            if old is not None and self.on_delete:
                self.on_delete(key, old)
            return
        value = self.transform(obj)
        with self._lock:
            self.version += 1
            if value is None:
                old = self._items.pop(key, None)
            else:
                old = None
                self._items[key] = value
        if old is not None and self.on_delete:
            self.on_delete(key, old)


def _events(stream: Any) -> Any:
    """The watch's events; an ERROR event (e.g. 410 Gone: the resourceVersion is too old) as
    :class:`ApiException`. ``Watch`` with ``deserialize=False`` trips over ERROR events itself
    (it looks for a ``raw_object`` key that only deserialized events have)."""
    try:
        yield from stream
    except KeyError as exc:
        raise ApiException(status=410, reason=f"watch ended with an error event ({exc})") from None


def _key(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def _list_function(api: client.ApiClient, api_version: str, plural: str) -> Callable[..., Any]:
    """A function ``kubernetes.watch.Watch.stream`` can call (it adds ``watch=True``)."""
    path = resource_path(api_version, plural)

    def list_objects(**kwargs: Any) -> Any:
        q: list[tuple[str, Any]] = []
        for name, param in (
            ("watch", "watch"),
            ("resource_version", "resourceVersion"),
            ("allow_watch_bookmarks", "allowWatchBookmarks"),
            ("timeout_seconds", "timeoutSeconds"),
        ):
            if kwargs.get(name) is not None:
                v = kwargs[name]
                q.append((param, str(v).lower() if isinstance(v, bool) else v))
        return raw_request(api, path, query=q, timeout=kwargs.get("_request_timeout"))

    return list_objects
