"""What a policy action writes to: the job's identity and the few facts a Kubernetes write or a
requeue check needs.

The runner builds it from the job's :class:`~auditor.core.job_summary.JobSummary`; recovery, which
finishes a step a crash interrupted, has only the ``job_ref`` stored with the decision (the same
fields, :meth:`ActionTarget.to_ref`), so both paths hand the actions one typed value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from auditor.core.identity import JobKey, KeyedByJob
from auditor.core.job_summary import JobSummary, SummaryFormatError


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionTarget(KeyedByJob):
    """The job an action targets: its key, uid, team, queue, pods and verdict (None when unknown)."""

    key: JobKey
    uid: str | None = None
    team: str | None = None
    queue: str | None = None
    pods: tuple[str, ...] = ()
    verdict: str | None = None

    @classmethod
    def of_summary(cls, s: JobSummary) -> ActionTarget:
        return cls(key=s.key, uid=s.uid, team=s.team, queue=s.queue, pods=s.pods, verdict=s.verdict.value)

    @classmethod
    def of_ref(cls, ref: Mapping[str, object], *, default_cluster: str = "default") -> ActionTarget:
        """From a stored ``job_ref`` (or any document with ``namespace`` and ``job``); a
        :class:`SummaryFormatError` (permanent: nothing can be written to such a job) naming what
        is missing when it has no job identity."""
        try:
            key = JobKey.of_document(ref, default_cluster=default_cluster)
        except ValueError as exc:
            raise SummaryFormatError(str(exc)) from None
        pods = ref.get("pods") or []
        if not isinstance(pods, list) or not all(isinstance(p, str) for p in pods):
            raise SummaryFormatError(f"job_ref of {key}: pods must be a list of pod names, got {pods!r}")

        def opt(name: str) -> str | None:
            v = ref.get(name)
            return v if isinstance(v, str) else None

        return cls(
            key=key, uid=opt("uid"), team=opt("team"), queue=opt("queue"), pods=tuple(pods), verdict=opt("verdict")
        )

    def to_ref(self) -> dict[str, object]:
        """The ``job_ref`` stored with a decision (read back by :meth:`of_ref` on a resume)."""
        return {
            **self.key.fields(),
            "uid": self.uid,
            "team": self.team,
            "queue": self.queue,
            "pods": list(self.pods),
            "verdict": self.verdict,
        }
