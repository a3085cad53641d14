"""A job's identity, with its one text form and the one parser of it.

The audit JSON names a job by ``cluster``, ``namespace`` and ``job`` (``Kind/name``); the store,
the decision log, dedup keys and the CLI's arguments use ``cluster/namespace/Kind/name``. Both
forms are written by :meth:`JobKey.__str__` / :func:`format_job` and read by :meth:`JobKey.parse`
/ :func:`split_job` alone, so they cannot drift apart.

Kubernetes names and kinds never hold a ``/``; a cluster name may (it is ours to choose), so
a key is split from the right.

**Identities from outside are checked here, once, at the edge.** A metric label or an owner
reference can hold anything (labels come from exporters and from whatever workloads can push;
an ownerReference's name and kind are only required to be non-empty by the apiserver), and one
such value (``pod="job-1/../x"``) once made every later ``split_job`` fail and took the whole
audit down. :func:`check_pod` and :func:`check_job` hold the apiserver's own rules
(k8s.io/apimachinery ``IsDNS1123Label``/``IsDNS1123Subdomain``, ``content.IsPathSegmentName``):
a value that fails them raises :class:`InvalidIdentity` with a short ``reason`` (a metric label
value, ``gpu_auditor_series_rejected_total{reason}``), and the caller quarantines the one series
or pod (:class:`Quarantine`) while the rest of the cycle goes on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field


def format_job(kind: str, name: str) -> str:
    """The audit JSON's ``job`` field: ``Kind/name``."""
    return f"{kind}/{name}"


def split_job(job: str) -> tuple[str, str]:
    """``Kind/name`` → (kind, name); ValueError when either part is missing."""
    kind, sep, name = job.partition("/")
    if not sep or not kind or not name or "/" in name:
        raise ValueError(f"job {job!r}: expected Kind/name")
    return kind, name


@dataclass(frozen=True, slots=True, order=True)
class JobKey:
    """``cluster/namespace/Kind/name``: unique across the clusters that share one store."""

    cluster: str
    namespace: str
    kind: str
    name: str

    @property
    def job(self) -> str:
        """``Kind/name``, the job field of the audit JSON."""
        return format_job(self.kind, self.name)

    def __str__(self) -> str:
        return f"{self.cluster}/{self.namespace}/{self.kind}/{self.name}"

    def columns(self) -> dict[str, str]:
        """The identity as table columns (``cluster``, ``namespace``, ``kind``, ``name``): how the
        policy tables key a job."""
        return {"cluster": self.cluster, "namespace": self.namespace, "kind": self.kind, "name": self.name}

    def fields(self) -> dict[str, str]:
        """The audit JSON's identity fields (``cluster``, ``namespace``, ``job``), in its order;
        :meth:`of_document` reads them back."""
        return {"cluster": self.cluster, "namespace": self.namespace, "job": self.job}

    @classmethod
    def of(cls, cluster: str, namespace: str, job: str) -> JobKey:
        """From the audit JSON's three fields (``job`` is ``Kind/name``)."""
        kind, name = split_job(job)
        return cls(cluster, namespace, kind, name)

    @classmethod
    def of_document(cls, doc: Mapping[str, object], *, default_cluster: str = "default") -> JobKey:
        """The identity of an audit-JSON document (``cluster``, else ``default_cluster``;
        ``namespace``; ``job``); ValueError naming what is missing."""
        cluster, namespace, job = doc.get("cluster") or default_cluster, doc.get("namespace"), doc.get("job")
        if not isinstance(cluster, str) or not isinstance(namespace, str) or not namespace or not isinstance(job, str):
            raise ValueError(
                f"summary without a job identity: cluster {cluster!r}, namespace {namespace!r}, job {job!r}"
            )
        return cls.of(cluster, namespace, job)

    @classmethod
    def parse(cls, text: str, *, cluster: str | None = None) -> JobKey:
        """``cluster/namespace/Kind/name``; with ``cluster`` given, ``namespace/Kind/name`` of
        that cluster. ValueError naming the expected form when a part is missing."""
        parts = text.strip().split("/")
        if cluster is not None:
            if len(parts) != 3 or not all(parts):
                raise ValueError(f"{text!r}: expected NAMESPACE/KIND/NAME")
            return cls(cluster, *parts)
        head, *rest = text.strip().rsplit("/", 3)
        if len(rest) != 3 or not head or not all(rest):
            raise ValueError(f"{text!r}: expected CLUSTER/NAMESPACE/KIND/NAME")
        return cls(head, *rest)


class KeyedByJob:
    """``cluster``, ``namespace`` and ``job`` (``Kind/name``) of a value that holds its job's
    :class:`JobKey` as ``key`` (a summary, an action's target)."""

    __slots__ = ()
    key: JobKey

    @property
    def cluster(self) -> str:
        return self.key.cluster

    @property
    def namespace(self) -> str:
        return self.key.namespace

    @property
    def job(self) -> str:
        """``Kind/name``."""
        return self.key.job


#: k8s.io/apimachinery/pkg/util/validation: a DNS-1123 label (63 at most) and subdomain (253)
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
#: a kind as a CRD may spell it (``names.kind``: a DNS-1035 label once lower-cased), without ``/``
_KIND = re.compile(r"[A-Za-z]([-A-Za-z0-9]*[A-Za-z0-9])?")

#: the reasons an identity is refused (the ``reason`` label of gpu_auditor_series_rejected_total)
REASONS = ("invalid_namespace", "invalid_pod", "invalid_container", "invalid_kind", "invalid_name")


class InvalidIdentity(ValueError):
    """A name from outside that no Kubernetes object can hold: ``reason`` is one of
    :data:`REASONS`, ``field`` says which label or field held ``value``, ``why`` the rule."""

    def __init__(self, reason: str, field: str, value: object, why: str) -> None:
        # a label value that is not text at all (a proxy's JSON) is named by its repr
        text = value if isinstance(value, str) else repr(value)
        super().__init__(f"{field} {text!r}: {why}")
        self.reason, self.field, self.value, self.why = reason, field, text, why


def _fits(pattern: re.Pattern[str], value: str, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and pattern.fullmatch(value) is not None


def is_dns1123_label(value: str) -> bool:
    """A namespace's or a container's name: lower-case alphanumerics and ``-``, 63 at most."""
    return _fits(_DNS1123_LABEL, value, DNS1123_LABEL_MAX)


def is_dns1123_subdomain(value: str) -> bool:
    """A pod's (and most objects') name: DNS-1123 labels joined by ``.``, 253 at most."""
    return _fits(_DNS1123_SUBDOMAIN, value, DNS1123_SUBDOMAIN_MAX)


def is_path_segment_name(value: str) -> bool:
    """Any object's name as the apiserver stores it (``content.IsPathSegmentName``): not ``.``
    or ``..``, no ``/`` or ``%``; here also non-empty, printable and without white space (a
    control character has no business in a job's name, every rendering would have to escape
    it, and a key's text form is read back stripped: ``name "a "`` would come back ``"a"``)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= DNS1123_SUBDOMAIN_MAX
        and value not in (".", "..")
        and "/" not in value
        and "%" not in value
        and value.isprintable()
        and not any(c.isspace() for c in value)
    )


_LABEL_RULE = "not a DNS-1123 label (lower-case letters, digits and '-', 63 at most)"
_SUBDOMAIN_RULE = "not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', 253 at most)"


def check_pod(namespace: str, pod: str, container: str = "") -> tuple[str, str, str]:
    """``(namespace, pod, container)`` of a workload pod as metric labels name it, when
    Kubernetes could hold it (a namespace and a container are DNS-1123 labels, a pod's name a
    DNS-1123 subdomain; no container is fine); InvalidIdentity otherwise."""
    if not is_dns1123_label(namespace):
        raise InvalidIdentity("invalid_namespace", "namespace", namespace, _LABEL_RULE)
    if not is_dns1123_subdomain(pod):
        raise InvalidIdentity("invalid_pod", "pod", pod, _SUBDOMAIN_RULE)
    if container != "" and not is_dns1123_label(container):
        raise InvalidIdentity("invalid_container", "container", container, _LABEL_RULE)
    return namespace, pod, container


def check_job(namespace: str, kind: str, name: str) -> tuple[str, str, str]:
    """``(namespace, kind, name)`` of a job (a pod's top owner) when the product can name it:
    ``Kind/name`` splits back (:func:`split_job`), so neither holds a ``/``. The apiserver
    requires no more of an ownerReference than that its kind and name are non-empty, so an
    owner's name is held to the rule every stored object's name meets (a path segment)."""
    if not is_dns1123_label(namespace):
        raise InvalidIdentity("invalid_namespace", "namespace", namespace, _LABEL_RULE)
    if not _fits(_KIND, kind, DNS1123_LABEL_MAX):
        raise InvalidIdentity("invalid_kind", "kind", kind, "not a kind (letters, digits and '-', 63 at most)")
    if not is_path_segment_name(name):
        raise InvalidIdentity(
            "invalid_name", "name", name, "not an object name (no '/', '%' or space, not '.' or '..', printable)"
        )
    return namespace, kind, name


#: at most this many refused values are named per reason (the count has them all)
NAMED_PER_REASON = 3
#: a named value is cut to this many characters (a label value may be megabytes)
NAMED_CHARS = 80


@dataclass(slots=True)
class Quarantine:
    """What one read or cycle refused: series (or pods) per reason, the first few values named.

    A hostile value is said once (:meth:`lines`, for the log, ``audit``'s stderr and ``doctor``)
    and counted (``gpu_auditor_series_rejected_total{reason}``); nothing else of its series is
    kept, so it reaches no job, no store row and no report."""

    counts: dict[str, int] = field(default_factory=dict)
    named: dict[str, list[str]] = field(default_factory=dict)

    def add(self, err: InvalidIdentity, n: int = 1) -> None:
        self.counts[err.reason] = self.counts.get(err.reason, 0) + n
        named = self.named.setdefault(err.reason, [])
        if len(named) < NAMED_PER_REASON:
            value = err.value if len(err.value) <= NAMED_CHARS else err.value[:NAMED_CHARS] + "..."
            text = f"{err.field} {value!r}"
            if text not in named:
                named.append(text)

    def update(self, other: Quarantine) -> None:
        for reason, n in other.counts.items():
            self.counts[reason] = self.counts.get(reason, 0) + n
        self._name(other)

    def refuses_job(self, namespace: str, kind: str, name: str, n: int = 1) -> bool:
        """True (and counted, ``n`` series) when :func:`check_job` refuses the job's identity."""
        try:
            check_job(namespace, kind, name)
        except InvalidIdentity as bad:
            self.add(bad, n)
            return True
        return False

    def most(self, other: Quarantine) -> None:
        """Per reason, the larger of the two counts: a cycle read in chunks sees one hostile
        series in each, and counts it once."""
        for reason, n in other.counts.items():
            self.counts[reason] = max(self.counts.get(reason, 0), n)
        self._name(other)

    def _name(self, other: Quarantine) -> None:
        for reason, texts in other.named.items():
            named = self.named.setdefault(reason, [])
            for text in texts:
                if len(named) < NAMED_PER_REASON and text not in named:
                    named.append(text)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __bool__(self) -> bool:
        return bool(self.counts)

    def lines(self, what: str = "series") -> list[str]:
        """One line per reason: ``2 series rejected (invalid_pod): pod 'job-1/../x', ...``."""
        return [
            f"{n} {what} rejected ({reason}): " + ", ".join(self.named.get(reason, ())) + " (not a Kubernetes name)"
            for reason, n in sorted(self.counts.items())
        ]
