"""The bucket write's fast row builder gives exactly the rows and pod spans of the per-bucket
checks (:func:`auditor.store.buckets._bucket_row`, :func:`auditor.store.claims.spans_of`), and
leaves every bucket it cannot vouch for to them: what they refuse is refused with their message."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from enum import IntEnum

import pytest
import sqlalchemy as sa

from auditor.core.metrics import Metric
from auditor.core.model import Bucket, GpuId, JobRef, PodRef
from auditor.store import Store
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
    spans, _typed = _add_rows(rows, job_id, buckets, _to_db)
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


def _stored(store: Store, cluster: str) -> list[tuple]:
    with store.reading("compare") as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT j.name, b.pod_name, b.container, b.gpu_uuid, b.gpu_instance, b.hostname, b.gpu_index, "
                    'b.gpu_model, b.mig_profile, b.metric, b.start, b."end", b.total, b.count, b.minimum, b.maximum, '
                    "b.dropped FROM gpu_buckets b JOIN jobs j ON j.id = b.job_id WHERE j.cluster = :c "
                    "ORDER BY 1, 2, 4, 10, 11"
                ),
                {"c": cluster},
            )
        ]


@pytest.mark.parametrize("odd", [False, True], ids=["typed rows", "a job the fast path leaves"])
def test_a_group_write_stores_what_one_write_per_job_stores(store_url: str, odd: bool) -> None:
    """PostgreSQL takes typed rows in COPY's binary format, others as text: the same rows
    (cluster ``one`` written a job at a time, cluster ``group`` in one group write)."""
    store = Store.open(store_url)
    try:
        for cluster in ("one", "group"):
            per_job = []
            for i in range(3):
                job = JobRef(cluster, "ns", "Job", f"j{i}", uid=f"{cluster}-{i}")
                buckets = [b._replace(pod=PodRef("ns", f"j{i}-{b.pod.pod}", b.pod.container)) for b in _buckets()]
                if odd and i == 1:  # an index that is not a string: the per-bucket path writes it
                    buckets = [b._replace(gpu=replace(b.gpu, index=3)) for b in buckets]
                per_job.append((store.upsert_job(job, T0 - W, T0 + 6 * W), buckets))
            if cluster == "group":
                store.replace_buckets_many(per_job)
            else:
                for job_id, buckets in per_job:
                    store.replace_buckets(job_id, buckets)
        one, group = _stored(store, "one"), _stored(store, "group")
    finally:
        store.close()
    assert one == group and len(one) == 3 * len(_reference(1, _buckets())[0])
