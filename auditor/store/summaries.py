"""The summary document's fields copied into columns of ``job_summaries``.

Kept apart from the store so that the summary's shape (owned by the core's summary mapping)
and its stored columns change together in one small module.
"""

from __future__ import annotations

from typing import Any

#: Fields of the summary document copied into columns of ``job_summaries`` (migrations 0005 and
#: 0010, whose backfills extract the same paths with the same types): column → (path, JSON type).
SUMMARY_FIELDS: dict[str, tuple[tuple[str, ...], str]] = {
    "job": (("job",), "string"),
    "gpu_model": (("gpu_model",), "string"),
    "busy_signal": (("busy_signal",), "string"),
    "sm_active": (("sm_active",), "number"),
    "tensor_active": (("tensor_active",), "number"),
    "coverage": (("coverage",), "number"),
    "gpu_util_samples": (("stats", "gpu_util", "samples"), "integer"),
    "gr_engine_active_samples": (("stats", "gr_engine_active", "samples"), "integer"),
    # the MFU and its gap (migration 0010, issue 28): the report and the console sum and rank by them
    "mfu_estimate": (("mfu_estimate",), "number"),
    "mfu_reference": (("mfu_reference",), "number"),
    "mfu_class": (("mfu_class",), "string"),
    "recoverable_gpu_hours": (("recoverable_gpu_hours",), "number"),
}
_BIG = 10**18  # integers beyond 18 digits stay NULL (the columns are 64-bit)


def summary_columns(doc: dict) -> dict[str, Any]:
    """The :data:`SUMMARY_FIELDS` columns of one plain-JSON summary document: the field's value
    when it has the column's type (booleans are not numbers), else None."""
    out: dict[str, Any] = {}
    for column, (path, kind) in SUMMARY_FIELDS.items():
        v: Any = doc
        for key in path:
            v = v.get(key) if isinstance(v, dict) else None
        if isinstance(v, bool):
            v = None
        elif kind == "string":
            v = v if isinstance(v, str) else None
        elif kind == "number":
            v = float(v) if isinstance(v, (int, float)) and abs(v) < 1e300 else None
        else:
            v = v if isinstance(v, int) and -_BIG < v < _BIG else None
        out[column] = v
    return out
