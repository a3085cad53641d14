"""The project's exception types.

Every error the program reports is one of these, so entry points can map them to exit codes
(``BadInput`` → 2, everything else → 1) and the operator loop can tell a retry from a give-up.
"""

from __future__ import annotations


class AuditorError(Exception):
    """Base of every error gpu-auditor raises on purpose."""

    retryable: bool = False


class RetryableError(AuditorError):
    """A failure that may go away by itself (a server down, a timeout, a 503)."""

    retryable = True


class PermanentError(AuditorError):
    """A failure that retrying cannot fix (a refused query, a schema mismatch)."""


class BadInput(PermanentError):
    """Input from the user was wrong; the message says where (file, line, field or flag)."""


class SourceUnavailable(RetryableError):
    """A metrics source (Prometheus, a trace file) could not be reached or read."""


class QueryRefused(PermanentError):
    """A metrics source answered but refused the query (HTTP 400/422, a bad expression)."""


class QueryTooLarge(QueryRefused):
    """The engine refused the query for its size, by one of its limits (``limit`` says which).

    ``limit`` is ``samples``, ``points`` or ``length`` (fewer per query when the time range is
    split: the source halves the range and asks again) or ``series`` (the same series in every
    half: only fewer series per query helps, e.g. ``--match`` or sharding).
    """

    def __init__(self, message: str, *, limit: str) -> None:
        super().__init__(message)
        self.limit = limit

    @property
    def splits_by_time(self) -> bool:
        return self.limit != "series"


class MalformedAnswer(SourceUnavailable):
    """A metrics source answered 200 with a body that is not the answer asked for (``result``
    null, a ``string`` where a matrix was asked, not JSON): a garbled server or a proxy in
    front of one, so retryable (exit 1) like an unreachable one; nothing of it is stored."""


class AnswerTooLarge(QueryRefused):
    """An answer, or a read's answers together, went past one of our own bounds (``bound``
    names the setting: ``prometheus.max_series_per_answer``, ``prometheus.max_series_per_cycle``
    or ``prometheus.max_read_memory_mb``). Splitting by time cannot help (the same series are in
    every half), so unlike :class:`QueryTooLarge` it is never split: the message names the
    selector and says how to select fewer series."""

    def __init__(self, message: str, *, bound: str) -> None:
        super().__init__(message)
        self.bound = bound


class StoreError(AuditorError):
    """The store could not read or write; ``retryable`` tells whether a retry can help."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class RequeueRefused(PermanentError):
    """The job cannot be requeued safely (a bare Pod, an unknown kind, a finished Workload)."""


class LeaseUnavailable(PermanentError):
    """The Lease cannot be taken, and waiting will not change that (e.g. 403 Forbidden)."""


class LeaseNamespaceMissing(LeaseUnavailable, BadInput):
    """The Lease's namespace does not exist: a setting to fix (exit 2), never "someone holds it"."""
