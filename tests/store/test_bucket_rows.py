"""The bucket write's fast row builder gives exactly the rows and pod spans of the per-bucket
checks (:func:`auditor.store.buckets._bucket_row`, :func:`auditor.store.claims.spans_of`), and
leaves every bucket it cannot vouch for to them: what they refuse is refused with their message."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from enum import IntEnum

import pytest

from auditor.core.metrics import Metric
from auditor.core.model import Bucket, GpuId, PodRef
from auditor.store.buckets import _add_rows, _bucket_row, _fast_rows
from auditor.store.claims import spans_of
from auditor.store.values import Invalid

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
W = timedelta(minutes=5)


def _to_db(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat()


def _reference(job_id: int, buckets: list) -> tuple[dict, dict]:
    rows: dict = {}
    for b in buckets:
        row = _bucket_row(job_id, b, _to_db)
        rows[row[:6] + row[10:12]] = row
    return rows, spans_of(buckets)


def _built(job_id: int, buckets: list) -> tuple[dict, dict]:
    rows: dict = {}
    spans = _add_rows(rows, job_id, buckets, _to_db)
    return rows, spans


def _buckets() -> list[Bucket]:
    pods = [PodRef("ns", f"p{i}", "main" if i else None) for i in range(3)]
    gpus = [
        GpuId(uuid="GPU-a", instance=None, hostname="n1", index="0", model="H200", mig_profile=None),
        GpuId(uuid="GPU-b", instance="3", hostname=None, index=None, model=None, mig_profile="1g.18gb"),
    ]
    out = []
    for k in range(3):
        start = T0 + k * W
        for pod in pods:
            for gpu in gpus:
                for m in (Metric.GPU_UTIL, Metric.SM_ACTIVE):
                    out.append(Bucket(pod, gpu, m, start, start + W, 12.5 * k, 20, 0.25, 0.75, k))
    # shared objects and copies of them, a bucket without samples (NaN bounds), one given twice
    # (the last wins), an equal but distinct pod object, and a time in another zone
    same_pod = PodRef("ns", "p1", "main")
    plus_one = timezone(timedelta(hours=1))
    out += [
        Bucket(pods[0], gpus[0], Metric.GPU_UTIL, T0, T0 + W, 0.0, 0, math.nan, math.nan, 3),
        Bucket(pods[0], gpus[0], Metric.GPU_UTIL, T0, T0 + W, 7.0, 2, None, 4.0, 0),  # type: ignore[arg-type]
        Bucket(same_pod, gpus[1], Metric.SM_ACTIVE, T0 + 5 * W, T0 + 6 * W, 1.0, 1, 1, 2, 0),
        Bucket(pods[2], gpus[0], Metric.GPU_UTIL, (T0 - W).astimezone(plus_one), T0, 3.0, 1, 3.0, 3.0, 0),
    ]
    return out


def test_rows_and_spans_equal_the_per_bucket_checks() -> None:
    buckets = _buckets()
    rows, spans = _built(7, buckets)
    ref_rows, ref_spans = _reference(7, buckets)
    assert list(rows.items()) == list(ref_rows.items())  # the same rows in the same order
    assert [[type(v) for v in r] for r in rows.values()] == [[type(v) for v in r] for r in ref_rows.values()]
    assert spans == ref_spans
    assert _fast_rows(7, buckets, _to_db) == (rows, spans)  # all of it through the fast path


class Small(IntEnum):
    ONE = 1


@pytest.mark.parametrize(
    "change",
    [
        {"count": Small.ONE},  # an int subclass: the per-bucket check takes it
        {"total": 3},  # an int total: stored as a float
        {"metric": "gpu_util"},  # a metric by name
        {"total": 1e308},  # finite, whatever the sum of the job's totals
    ],
)
def test_what_the_fast_path_leaves_is_written_all_the_same(change: dict) -> None:
    buckets = _buckets()
    buckets[4] = buckets[4]._replace(**change)
    rows, spans = _built(7, buckets)
    ref_rows, ref_spans = _reference(7, buckets)
    assert list(rows.items()) == list(ref_rows.items())
    assert spans == ref_spans


@pytest.mark.parametrize(
    "change, message",
    [
        ({"total": math.inf}, "total inf is not finite"),
        ({"count": -1}, "count -1 is not a count"),
        ({"dropped": True}, "dropped True is not a count"),
        ({"count": 2**31}, "is not a count"),
        ({"start": datetime(2026, 12, 1)}, "naive start/end"),
        ({"end": T0 - W}, "is not after start"),
        ({"metric": "no_such_metric"}, "bad bucket"),
    ],
)
def test_what_the_per_bucket_checks_refuse_is_refused_with_their_message(change: dict, message: str) -> None:
    buckets = _buckets()
    buckets[4] = buckets[4]._replace(**change)
    with pytest.raises(Invalid, match=message) as refused:
        _built(7, buckets)
    with pytest.raises(Invalid) as reference:
        _reference(7, buckets)
    assert str(refused.value) == str(reference.value)
