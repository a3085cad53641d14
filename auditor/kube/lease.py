"""Leader election on a ``coordination.k8s.io/v1`` Lease, with a release on clean shutdown.

Why not ``kubernetes.leaderelection``: its elector runs a blocking loop that cannot be stopped,
never gives the lease back (a successor waits a whole lease duration after every clean restart),
and has no "try for N seconds" mode for ``run --once``. This one follows client-go's rules:

* a candidate takes the Lease when it does not exist, when it is free (no holder: released) or
  when the holder has not renewed it for ``lease_duration`` (by this candidate's own clock since
  it last saw the record change — never by comparing clocks across machines);
* the holder renews every ``retry_period``; if it cannot renew for ``renew_deadline`` it stops
  leading (the caller stops auditing) before anyone else may take over;
* every write is a compare-and-swap on ``resourceVersion`` (409 Conflict: someone else won);
* :meth:`release` clears the holder so a standby takes over at its next try, not after the
  lease duration.

Permissions: ``create`` leases, ``get``/``update`` the one Lease by name (auditor/permissions.yaml,
feature ``leaderElection``).

Failures that waiting cannot mend are said at once, not after a lease duration of retries: the
Lease's namespace does not exist (:class:`LeaseNamespaceMissing`), or the apiserver refuses us
(401/403, :class:`LeaseUnavailable`). A holder is named only when one was read from a real Lease.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Callable, Mapping

from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.rest import ApiException

from auditor.clock import SYSTEM_CLOCK
from auditor.errors import LeaseNamespaceMissing as LeaseNamespaceMissing  # re-exported
from auditor.errors import LeaseUnavailable as LeaseUnavailable  # re-exported
from auditor.kube.client import call_json

if TYPE_CHECKING:
    from auditor.ports import Clock

log = logging.getLogger(__name__)

#: where the pod's service account names its namespace (beside its token)
SERVICE_ACCOUNT_NAMESPACE = os.path.join(
    os.path.dirname(kube_config.incluster_config.SERVICE_TOKEN_FILENAME), "namespace"
)


def lease_namespace(
    configured: str | None,
    *,
    in_cluster: bool,
    kubeconfig: str | None = None,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, str]:
    """The Lease's namespace and where that choice came from (for messages).

    The setting wins; then ``$POD_NAMESPACE`` (the chart sets it); in a pod, its service
    account's namespace; outside a cluster, the kubeconfig context's namespace, as kubectl
    would use it (``default`` when the context names none).
    """
    env = os.environ if environ is None else environ
    if configured:
        return configured, "leader_election.namespace"
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"], "$POD_NAMESPACE"
    if in_cluster:
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
                ns = f.read().strip()
            if ns:
                return ns, "the pod's service account"
        except OSError:
            pass
        return "gpu-auditor", "the default (no $POD_NAMESPACE, no service account namespace)"
    try:
        contexts, active = kube_config.list_kube_config_contexts(config_file=kubeconfig)
    except (kube_config.ConfigException, OSError, TypeError, ValueError):
        return "default", "the default (no kubeconfig context could be read)"
    chosen = next((c for c in contexts or [] if c.get("name") == context), None) if context else active
    name = (chosen or {}).get("name", "?")
    context_ns = ((chosen or {}).get("context") or {}).get("namespace")
    if context_ns:
        return str(context_ns), f"the kubeconfig context {name!r}"
    return "default", f"the kubeconfig context {name!r}, which names no namespace"


def _why(exc: Exception) -> str:
    """An API error in one line: the status and the server's message, never the raw body."""
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message")
        except (ValueError, AttributeError):
            message = None
        return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")
    return str(exc)


def _namespace_missing(exc: ApiException) -> bool:
    """A 404 whose Status names the namespace (not the Lease) as the missing object."""
    if exc.status != 404:
        return False
    try:
        details = json.loads(exc.body or "{}").get("details") or {}
    except (ValueError, AttributeError):
        return False
    return details.get("kind") == "namespaces"


def _micro(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Holds (or waits for) one Lease. Thread-safe; the renew loop runs in its own thread.

    ``on_started(…)``/``on_stopped(…)`` are called from the elector's thread when leadership
    is gained or lost. :attr:`is_leader` is the current state; :meth:`ensure_leader` is the check
    to make right before acting (it is False as soon as a renewal is overdue). Every time it
    reads (the Lease's renew times, its own deadlines, the waits between tries) comes from
    ``clock``, so a test with a fake clock runs a whole term in milliseconds.
    """

    def __init__(
        self,
        api: client.ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: timedelta = timedelta(seconds=15),
        renew_deadline: timedelta = timedelta(seconds=10),
        retry_period: timedelta = timedelta(seconds=2),
        on_started: Callable[[], None] | None = None,
        on_stopped: Callable[[], None] | None = None,
        on_fatal: Callable[[LeaseUnavailable], None] | None = None,
        namespace_origin: str = "",
        clock: "Clock" = SYSTEM_CLOCK,
    ) -> None:
        self.api = api
        self.clock = clock
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration.total_seconds()
        self.renew_deadline = renew_deadline.total_seconds()
        self.retry_period = retry_period.total_seconds()
        self.on_started = on_started
        self.on_stopped = on_stopped
        #: called (from the elector's thread) when the loop gives up: the Lease can never be taken
        self.on_fatal = on_fatal
        self.namespace_origin = namespace_origin
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self._lock = threading.RLock()
        self._leader = False
        self._last_renew = 0.0  # monotonic time of our last successful write as holder
        self._observed: tuple | None = None  # (holder, renewTime, transitions) last seen
        self._observed_at = 0.0  # monotonic time it was first seen
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.transitions = 0
        self.last_error: str | None = None
        #: why the Lease can never be taken (its namespace is missing): the loop stops
        self.fatal: LeaseUnavailable | None = None
        #: why the last attempt was refused (401/403): ``acquire`` gives up at once, the loop retries
        self.refused: LeaseUnavailable | None = None

    # ------------------------------------------------------------------ state

    @property
    def is_leader(self) -> bool:
        with self._lock:
            return self._leader and self.clock.monotonic() - self._last_renew < self.renew_deadline

    def ensure_leader(self) -> bool:
        return self.is_leader

    def holder(self) -> str | None:
        """The holder last read from the Lease (None: not read yet, or free): the only one we may name."""
        with self._lock:
            return (self._observed or (None,))[0] or None

    # ------------------------------------------------------------------ loop

    def start(self) -> "LeaderElector":
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        warned: str | None = None
        while not self._stop.is_set():
            # whether we led, not whether the term is still current: a deadline that passed
            # during the wait is a loss to announce too (is_leader would already say False)
            with self._lock:
                was = self._leader
            ok = self.try_acquire_or_renew()
            if self.fatal is not None:
                log.error("leader election stopped: %s", self.fatal)
                if self.on_fatal:
                    fatal = self.fatal
                    self._safe(lambda fatal=fatal: self.on_fatal(fatal))  # type: ignore[misc]
                return
            refused = str(self.refused) if self.refused is not None else None
            if refused and refused != warned:  # RBAC may still be on its way: retry, but say it once
                log.warning("leader election: %s; retrying every %g s", refused, self.retry_period)
            warned = refused
            if ok and not was:
                log.info("became the leader (Lease %s/%s, identity %s)", self.namespace, self.name, self.identity)
                if self.on_started:
                    self._safe(self.on_started)
            elif was and not self.is_leader:
                self._lose("could not renew the Lease within the renew deadline")
            self.clock.wait(self._stop, self.retry_period)

    def _lose(self, why: str) -> None:
        with self._lock:
            if not self._leader:
                return
            self._leader = False
        log.warning("lost leadership: %s", why)
        if self.on_stopped:
            self._safe(self.on_stopped)

    @staticmethod
    def _safe(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            log.exception("leader-election callback failed")

    def acquire(self, timeout: float) -> bool:
        """Try to become the leader for up to ``timeout`` seconds (``run --once``).

        False when someone else held it all that time; raises :class:`LeaseUnavailable` (or
        :class:`LeaseNamespaceMissing`) at once when waiting cannot help.
        """
        deadline = self.clock.monotonic() + timeout
        while True:
            if self.try_acquire_or_renew():
                return True
            if self.fatal is not None:
                raise self.fatal
            if self.refused is not None:
                raise self.refused
            if self.clock.monotonic() >= deadline or self._stop.is_set():
                return False
            self.clock.wait(self._stop, min(self.retry_period, max(0.0, deadline - self.clock.monotonic())))

    def stop(self, release: bool = True) -> None:
        """Stop the loop; with ``release`` give the Lease back if we hold it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.retry_period + 5)
        if release:
            self.release()

    # ------------------------------------------------------------------ one step

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when we hold the Lease afterwards."""
        now_wall = self.clock.now()
        now = self.clock.monotonic()
        self.refused = None
        try:
            lease = call_json(self.api, self._path, timeout=self.renew_deadline)
        except ApiException as exc:
            if exc.status != 404:
                return self._failed("get", exc)
            with self._lock:
                self._observed = None  # no Lease: nobody holds it
            body = self._body(None, now_wall, transitions=0, acquire=True)
            try:
                call_json(
                    self.api,
                    f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases",
                    method="POST",
                    body=body,
                    timeout=self.renew_deadline,
                )
            except ApiException as exc2:
                if _namespace_missing(exc2):
                    self.fatal = LeaseNamespaceMissing(self._missing_namespace())
                return self._failed("create", exc2)
            except Exception as exc2:  # noqa: BLE001
                return self._failed("create", exc2)
            return self._won(now)
        except Exception as exc:  # noqa: BLE001 - connection trouble counts as a failed renewal
            return self._failed("get", exc)

        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        seen = self.clock.monotonic()  # after the GET (as client-go): a slow read never shortens a term
        with self._lock:
            if record != self._observed:
                self._observed, self._observed_at = record, seen
            observed_at = self._observed_at
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        mine = holder == self.identity
        if holder and not mine and seen - observed_at < duration:
            self._lose(f"the Lease is held by {holder}")  # says so (on_stopped) if we led
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        body = self._body(lease, now_wall, transitions=transitions, acquire=not mine, spec=spec)
        try:
            call_json(self.api, self._path, method="PUT", body=body, timeout=self.renew_deadline)
        except ApiException as exc:
            if exc.status == 409:
                self.last_error = "the Lease changed under us (409 Conflict)"
                return self.is_leader
            return self._failed("update", exc)
        except Exception as exc:  # noqa: BLE001
            return self._failed("update", exc)
        return self._won(now)

    def _body(
        self, lease: dict | None, now: datetime, *, transitions: int, acquire: bool, spec: dict | None = None
    ) -> dict:
        acquired = (spec or {}).get("acquireTime")
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, int(round(self.lease_duration))),
                "acquireTime": _micro(now) if acquire or not acquired else acquired,
                "renewTime": _micro(now),
                "leaseTransitions": transitions,
            },
        }
        if lease is not None:
            body["metadata"]["resourceVersion"] = (lease.get("metadata") or {}).get("resourceVersion")
            for k in ("labels", "annotations"):
                v = (lease.get("metadata") or {}).get(k)
                if v:
                    body["metadata"][k] = v
        return body

    def _won(self, at: float) -> bool:
        with self._lock:
            if not self._leader:
                self.transitions += 1
            self._leader = True
            self._last_renew = at
            self.last_error = None
        return True

    def _failed(self, verb: str, exc: Exception) -> bool:
        why = f"{verb} the Lease {self.namespace}/{self.name}: {_why(exc)}"
        if isinstance(exc, ApiException) and exc.status in (401, 403):
            self.refused = LeaseUnavailable(
                f"not allowed to {why} (the identity needs the leaderElection rules of auditor/permissions.yaml)"
            )
        self.last_error = why
        log.debug("leader election: %s", why)
        return self.is_leader  # still the leader until the renew deadline passes

    def _missing_namespace(self) -> str:
        ns = self.namespace
        origin = f" (from {self.namespace_origin})" if self.namespace_origin else ""
        return (
            f"the Lease's namespace {ns!r}{origin} does not exist: create it (kubectl create namespace {ns}), "
            "choose an existing one with --lease-namespace NS or the leader_election.namespace setting, "
            "or run without a Lease with --no-leader-election (leader_election.enabled: false)"
        )

    def release(self) -> bool:
        """Give the Lease back (holder cleared) if we hold it; True when released."""
        with self._lock:
            was = self._leader
            self._leader = False
        if self.transitions == 0:
            return False  # never held by this process: nothing to give back
        try:
            lease = call_json(self.api, self._path, timeout=5)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not read the Lease to release it: %s", _why(exc))
            return False
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return False
        now = self.clock.now()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": (lease.get("metadata") or {}).get("resourceVersion"),
            },
            "spec": {
                # client-go's release: no holder, a 1 s duration, renew time now
                "holderIdentity": None,
                "leaseDurationSeconds": 1,
                "acquireTime": spec.get("acquireTime"),
                "renewTime": _micro(now),
                "leaseTransitions": spec.get("leaseTransitions") or 0,
            },
        }
        try:
            call_json(self.api, self._path, method="PUT", body=body, timeout=5)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not release the Lease: %s", _why(exc))
            return False
        log.info("released the Lease %s/%s", self.namespace, self.name)
        if was and self.on_stopped:
            self._safe(self.on_stopped)
        return True
