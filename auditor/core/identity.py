"""A job's identity, with its one text form and the one parser of it.

The audit JSON names a job by ``cluster``, ``namespace`` and ``job`` (``Kind/name``); the store,
the decision log, dedup keys and the CLI's arguments use ``cluster/namespace/Kind/name``. Both
forms are written by :meth:`JobKey.__str__` / :func:`format_job` and read by :meth:`JobKey.parse`
/ :func:`split_job` alone, so they cannot drift apart.

Kubernetes names and kinds never hold a ``/``; a cluster name may (it is ours to choose), so
a key is split from the right.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


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
