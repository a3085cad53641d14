"""The store against real databases: a SQLite file and the test bed's PostgreSQL.

Every behavioural test runs on both (the ``store_url`` parameter), because the product promises
identical results from either. The PostgreSQL variants are marked ``testbed``: they need the
real server from tests/conftest.py's ``postgres_url`` (a fresh empty database per test).
"""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from auditor.core.metrics import Metric
from auditor.core.model import Bucket, GpuId, JobRef, PodRef, Window
from auditor.errors import BadInput, StoreError
from auditor.store import Store, display_url
from auditor.store.tables import TABLES, JobRow

UTC = timezone.utc
CEST = timezone(timedelta(hours=2))
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
W = timedelta(minutes=5)
VERSION_TABLE = "gpu_auditor_schema_version"


def _head_revision() -> str:
    """The newest packaged migration: later revisions (0002 policies, ...) chain onto 0001."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from auditor.store.store import MIGRATIONS_DIR

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return ScriptDirectory.from_config(cfg).get_current_head()


@pytest.fixture
def store(store_url: str):
    s = Store.open(store_url)
    yield s
    s.close()


def job(name: str = "train", **kw) -> JobRef:
    fields = {"cluster": "c1", "namespace": "ml", "kind": "PyTorchJob", "name": name, "uid": "u-1", "team": "vision"}
    fields.update(kw)
    return JobRef(**fields)


def bucket(
    pod: str = "train-0",
    gpu: str = "GPU-a",
    metric: Metric = Metric.SM_ACTIVE,
    start: datetime = T0,
    total: float = 3.0,
    count: int = 10,
    **gpu_kw,
) -> Bucket:
    return Bucket(
        pod=PodRef("ml", pod, "worker"),
        gpu=GpuId(uuid=gpu, hostname="node-1", index="0", model="NVIDIA H200", **gpu_kw),
        metric=metric,
        start=start,
        end=start + W,
        total=total,
        count=count,
        minimum=0.1,
        maximum=0.5,
        dropped=1,
    )


def summary(name: str = "train", *, verdict: str = "healthy", waste: float | None = 1.0, **kw) -> dict:
    d = {
        "cluster": "c1",
        "namespace": "ml",
        "job": f"PyTorchJob/{name}",
        "team": "vision",
        "verdict": verdict,
        "start": "2026-11-30T08:00:00Z",
        "end": "2026-11-30T09:00:00Z",
        "gpu_hours": 8.0,
        "waste_gpu_hours": waste,
        "sm_active": None,
        "findings": [{"code": "x", "message": "m", "evidence": {"sm_active": 0.25}}],
        "gpus": [{"uuid": "GPU-a", "sm_active": 0.25}],
    }
    d.update(kw)
    return d


def count_rows(url: str, table: str) -> int:
    from auditor.store.urls import resolve

    engine = sa.create_engine(resolve(url))
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
    finally:
        engine.dispose()


# ---------------------------------------------------------------------- schema and opening


def test_migrations_from_empty_database_match_the_models(store_url: str) -> None:
    Store.open(store_url).close()
    from auditor.store.urls import resolve

    engine = sa.create_engine(resolve(store_url))
    try:
        with engine.connect() as conn:
            names = set(sa.inspect(conn).get_table_names())
            assert {"jobs", "gpu_buckets", "job_summaries", "audit_runs", VERSION_TABLE} <= names
            assert conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all() == [
                _head_revision()
            ]
            ours = sa.MetaData()
            for t in TABLES:
                t.to_metadata(ours)
            ctx = MigrationContext.configure(
                conn,
                opts={"compare_type": True, "include_object": lambda o, n, t, r, c: t != "table" or n in ours.tables},
            )
            assert compare_metadata(ctx, ours) == []
    finally:
        engine.dispose()
    # a second open finds the schema current and changes nothing
    s = Store.open(store_url)
    s.close()


def test_concurrent_opens_of_a_fresh_database_migrate_once(store_url: str) -> None:
    def open_and_write(i: int) -> int:
        s = Store.open(store_url)
        try:
            return s.upsert_job(job(f"j{i}"), T0, T0)
        finally:
            s.close()

    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(open_and_write, range(4)))
    assert len(set(ids)) == 4
    assert count_rows(store_url, VERSION_TABLE) == 1


def test_concurrent_opens_from_separate_processes(store_url: str) -> None:
    code = (
        "import sys; from datetime import datetime, timezone; from auditor.core.model import JobRef; "
        "from auditor.store import Store; s = Store.open(sys.argv[1]); "
        "t = datetime(2026, 11, 30, tzinfo=timezone.utc); "
        "print(s.upsert_job(JobRef('c1', 'ml', 'Job', sys.argv[2]), t, t)); s.close()"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, store_url, f"p{i}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for i in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err.decode()[-2000:] for _, err in outs]
    assert len({out.strip() for out, _ in outs}) == 3
    assert count_rows(store_url, VERSION_TABLE) == 1


def test_in_memory_sqlite_for_quick_experiments() -> None:
    with Store.open("sqlite://") as s:
        jid = s.upsert_job(job(), T0, T0)
        s.replace_buckets(jid, [bucket()])
        assert s.buckets(jid) == [bucket()]


def test_database_from_a_newer_version_is_refused(store_url: str) -> None:
    Store.open(store_url).close()
    from auditor.store.urls import resolve

    engine = sa.create_engine(resolve(store_url))
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(StoreError, match="newer gpu-auditor") as err:
        Store.open(store_url)
    assert not err.value.retryable


def test_default_store_is_a_sqlite_file_in_the_user_data_dir(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    with Store.open(None) as s:
        assert s.display_url == f"sqlite:///{tmp_path}/data/gpu-auditor/auditor.db"
        s.upsert_job(job(), T0, T0)
    assert (tmp_path / "data" / "gpu-auditor" / "auditor.db").is_file()


def test_bare_path_is_a_sqlite_file_and_parent_dirs_are_created(tmp_path) -> None:
    path = tmp_path / "a" / "b" / "x.db"
    with Store.open(str(path)) as s:
        assert s.find_job("ml", "PyTorchJob", "nope") is None
    assert path.is_file()


def test_unknown_database_scheme_is_bad_input() -> None:
    with pytest.raises(BadInput, match="unsupported database 'mysql'"):
        Store.open("mysql://u:pw@h/db")


# ---------------------------------------------------------------------- errors


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_failure_is_retryable_and_masks_the_password() -> None:
    url = f"postgresql://auditor:hunter2-secret@127.0.0.1:{_free_port()}/gpu?connect_timeout=2"
    with pytest.raises(StoreError) as err:
        Store.open(url)
    msg = str(err.value)
    assert err.value.retryable
    assert "hunter2" not in msg
    assert "postgresql+psycopg://auditor:***@127.0.0.1" in msg
    assert "migrate the schema failed" in msg


def test_display_url_masks_passwords_everywhere() -> None:
    assert display_url("postgresql://u:p%40ss@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert "s3cret" not in display_url("postgresql://u@h/db?password=s3cret")
    assert display_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_bad_input_never_loses_stored_data(store: Store) -> None:
    jid = store.upsert_job(job(), T0, T0)
    good = [bucket(gpu=f"GPU-{i}", total=float(i)) for i in range(5)]
    store.replace_buckets(jid, good)
    store.save_summary(jid, summary(verdict="idle"))

    # one garbage bucket among valid replacements: nothing of the batch is written
    changed = [bucket(gpu=f"GPU-{i}", total=9.0) for i in range(5)]
    with pytest.raises(StoreError, match="bad bucket ml/train-0 GPU-3") as err:
        store.replace_buckets(jid, changed[:3] + [bucket(gpu="GPU-3", total=math.nan)] + changed[4:])
    assert not err.value.retryable
    with pytest.raises(StoreError, match="naive"):
        store.replace_buckets(jid, [bucket(start=T0.replace(tzinfo=None))])
    # a database-level failure (foreign key: no such job) rolls back too
    with pytest.raises(StoreError, match="write 1 buckets of job 999999 failed") as err:
        store.replace_buckets(999999, [bucket()])
    assert store.display_url in str(err.value)
    assert [b.total for b in store.buckets(jid)] == [0.0, 1.0, 2.0, 3.0, 4.0]

    # a summary that is not JSON, or has no verdict, keeps the previous one
    with pytest.raises(StoreError, match="not plain JSON"):
        store.save_summary(jid, summary(verdict="healthy", sm_active=math.nan))
    with pytest.raises(StoreError, match="no verdict"):
        store.save_summary(jid, {"job": "x"})
    with pytest.raises(StoreError, match="no job with id"):
        store.save_summary(999999, summary())
    assert [s["verdict"] for s in store.summaries()] == ["idle"]


# ---------------------------------------------------------------------- jobs


def test_upsert_job_widens_the_span_and_keeps_one_row(store: Store) -> None:
    a = store.upsert_job(job(), T0, T0 + W)
    b = store.upsert_job(job(uid=None, team=""), T0 - W, T0)  # older window: unknown uid/team
    c = store.upsert_job(job(queue="q1"), T0 + W, T0 + 3 * W)
    assert a == b == c
    found = store.find_job("ml", "PyTorchJob", "train")
    assert found == (a, job(queue="q1"))
    jobs = JobRow.__table__
    with store._engine.connect() as conn:  # the span has no public reader yet; check the row
        first, last = conn.execute(sa.select(jobs.c.first_seen, jobs.c.last_seen)).one()
    assert (first, last) == (T0 - W, T0 + 3 * W)
    assert first.tzinfo is UTC


def test_find_job(store: Store) -> None:
    a = store.upsert_job(job("x", cluster="c1"), T0, T0)
    store.upsert_job(job("y", cluster="c1"), T0, T0)
    b = store.upsert_job(job("y", cluster="c2", uid="u-2"), T0, T0)
    assert store.find_job("ml", "PyTorchJob", "x") == (a, job("x"))
    assert store.find_job("ml", "pytorchjob", "x") == (a, job("x"))  # kind as users type it
    assert store.find_job("ml", "PyTorchJob", "x", cluster="c2") is None
    assert store.find_job("other", "PyTorchJob", "x") is None
    assert store.find_job("ml", "PyTorchJob", "y", cluster="c2") == (b, job("y", cluster="c2", uid="u-2"))
    with pytest.raises(BadInput, match=r"several clusters \(c1, c2\)"):
        store.find_job("ml", "PyTorchJob", "y")


# ---------------------------------------------------------------------- buckets


def test_writing_the_same_buckets_twice_leaves_one_copy(store: Store, store_url: str) -> None:
    jid = store.upsert_job(job(), T0, T0 + 2 * W)
    batch = [
        bucket(pod=p, gpu=g, metric=m, start=T0 + k * W)
        for p in ("train-0", "train-1")
        for g in ("GPU-a", "GPU-b")
        for m in (Metric.SM_ACTIVE, Metric.GPU_UTIL)
        for k in range(2)
    ]
    store.replace_buckets(jid, batch)
    store.replace_buckets(jid, batch)
    store.replace_buckets(jid, list(reversed(batch)))
    assert count_rows(store_url, "gpu_buckets") == len(batch) == 16
    assert sorted(store.buckets(jid), key=repr) == sorted(batch, key=repr)


def test_rewriting_a_bucket_replaces_its_values(store: Store) -> None:
    jid = store.upsert_job(job(), T0, T0)
    other = bucket(gpu="GPU-b", total=1.0)
    store.replace_buckets(jid, [bucket(total=3.0, count=10), other])
    # a re-audit sees more samples of the same bucket; last of duplicates in a batch wins
    store.replace_buckets(jid, [bucket(total=5.0, count=20), bucket(total=6.0, count=30)])
    got = {b.gpu.uuid: b for b in store.buckets(jid)}
    assert (got["GPU-a"].total, got["GPU-a"].count) == (6.0, 30)
    assert got["GPU-b"] == other


def test_buckets_restore_full_identity_and_empty_buckets(store: Store) -> None:
    jid = store.upsert_job(job(), T0, T0)
    mig = bucket(gpu="GPU-m", instance="3", mig_profile="3g.71gb", metric=Metric.GR_ENGINE_ACTIVE)
    empty = Bucket(
        pod=PodRef("ml", "train-0"),
        gpu=GpuId("GPU-e"),
        metric=Metric.POWER,
        start=T0,
        end=T0 + W,
        total=0.0,
        count=0,
        minimum=math.nan,
        maximum=math.nan,
        dropped=7,
    )
    store.replace_buckets(jid, [mig, empty])
    got = {b.gpu.key: b for b in store.buckets(jid)}
    assert got["GPU-m/3"] == mig
    assert got["GPU-m/3"].gpu.fraction == pytest.approx(3 / 7)
    e = got["GPU-e"]
    assert (e.count, e.dropped, e.mean, e.pod, e.gpu) == (0, 7, None, empty.pod, empty.gpu)
    assert math.isnan(e.minimum) and math.isnan(e.maximum)


def test_buckets_window_is_half_open_overlap(store: Store) -> None:
    jid = store.upsert_job(job(), T0, T0)
    store.replace_buckets(jid, [bucket(start=T0 + k * W) for k in range(4)])
    starts = lambda w: [b.start for b in store.buckets(jid, w)]  # noqa: E731
    assert starts(Window(T0 + W, T0 + 3 * W)) == [T0 + W, T0 + 2 * W]
    assert starts(Window(T0 + W + timedelta(seconds=1), T0 + 2 * W + timedelta(seconds=1))) == [T0 + W, T0 + 2 * W]
    assert starts(Window(T0 + 4 * W, T0 + 5 * W)) == []
    assert len(store.buckets(jid)) == 4
    assert store.buckets(jid + 1000) == []


def test_times_round_trip_as_aware_utc(store: Store) -> None:
    jid = store.upsert_job(job(), T0, T0)
    local = T0.astimezone(CEST)  # same instant, other offset
    store.replace_buckets(jid, [bucket(start=local + timedelta(microseconds=123456))])
    (b,) = store.buckets(jid)
    assert b.start == T0 + timedelta(microseconds=123456)
    assert b.start.tzinfo is UTC and b.end.tzinfo is UTC
    assert b.start.utcoffset() == timedelta(0)
    # the same instant written with another offset is the same bucket
    store.replace_buckets(jid, [bucket(start=T0 + timedelta(microseconds=123456), total=9.0)])
    assert [x.total for x in store.buckets(jid)] == [9.0]
    # summaries filter on instants, whatever offset the caller uses
    store.save_summary(jid, summary(start="2026-11-30T10:00:00+02:00", end="2026-11-30T11:00:00+02:00"))
    assert len(store.summaries(since=T0 - W, until=T0.astimezone(CEST))) == 1  # span [08:00, 09:00) UTC
    assert store.summaries(since=T0.astimezone(CEST)) == []
    with pytest.raises(StoreError, match="timezone-aware"):
        store.summaries(since=T0.replace(tzinfo=None))


def test_bulk_write_of_a_cycle_takes_statements_per_job_not_per_bucket(store: Store, store_url: str) -> None:
    """1,000 jobs × 8 GPUs × 10 metrics × 1 bucket, as one operator cycle writes them.

    The bulk path is checked by what it sends, not by a wall-clock bound (timings belong in
    bench/): the SQL statements of one job's write do not grow with its number of buckets
    (one executemany on SQLite, one COPY on PostgreSQL)."""
    metrics = list(Metric)[:10]
    jobs = {
        store.upsert_job(job(f"j{j}"), T0, T0 + W): [
            bucket(pod=f"j{j}-0", gpu=f"GPU-{j}-{g}", metric=m, total=float(g)) for g in range(8) for m in metrics
        ]
        for j in range(1000)
    }
    statements: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append(statement)

    sa.event.listen(store._engine, "before_cursor_execute", count)
    try:
        per_job = []
        for jid, batch in jobs.items():
            before = len(statements)
            store.replace_buckets(jid, batch)
            per_job.append(len(statements) - before)
        wide_id = store.upsert_job(job("wide"), T0, T0 + W)
        before = len(statements)
        store.replace_buckets(
            wide_id, [bucket(pod="wide-0", gpu=f"GPU-w-{g}", metric=m) for g in range(80) for m in metrics]
        )
        wide = len(statements) - before
    finally:
        sa.event.remove(store._engine, "before_cursor_execute", count)
    assert count_rows(store_url, "gpu_buckets") == 80_000 + 800
    assert max(per_job) <= 12, per_job[:5]
    assert wide <= max(per_job), (wide, max(per_job))  # 800 buckets: no more statements than 80
    for jid, batch in jobs.items():  # a re-write of the whole cycle is idempotent
        store.replace_buckets(jid, batch)
    assert count_rows(store_url, "gpu_buckets") == 80_000 + 800


# ---------------------------------------------------------------------- summaries and runs


def test_save_summary_replaces_and_round_trips(store: Store, store_url: str) -> None:
    jid = store.upsert_job(job(), T0, T0)
    first = summary(verdict="low_sm_efficiency")
    store.save_summary(jid, first)
    assert store.summaries() == [first]
    second = summary(verdict="healthy", waste=0.5)
    store.save_summary(jid, second)
    assert store.summaries() == [second]
    assert store.summary(jid) == second
    assert store.summary(jid + 1) is None
    assert count_rows(store_url, "job_summaries") == 1


def test_summaries_filters_and_order(store: Store) -> None:
    specs = [
        # name, cluster, namespace, team, start hour, end hour, waste
        ("a", "c1", "ml", "vision", 8, 9, 1.0),
        ("b", "c1", "ml", "speech", 9, 10, 5.0),
        ("c", "c1", "nlp", "nlp", 10, 12, None),
        ("d", "c2", "ml", "vision", 11, 12, 3.0),
    ]
    for name, cl, ns, team, h0, h1, waste in specs:
        jid = store.upsert_job(job(name, cluster=cl, namespace=ns, team=team), T0, T0)
        store.save_summary(
            jid,
            summary(
                name,
                cluster=cl,
                namespace=ns,
                team=team,
                waste=waste,
                start=f"2026-11-30T{h0:02d}:00:00Z",
                end=f"2026-11-30T{h1:02d}:00:00Z",
            ),
        )
    names = lambda **kw: [s["job"].split("/")[1] for s in store.summaries(**kw)]  # noqa: E731
    assert names() == ["b", "d", "a", "c"]  # most waste first, unknown waste last
    assert names(cluster="c1") == ["b", "a", "c"]
    assert names(namespace="ml") == ["b", "d", "a"]
    assert names(team="vision") == ["d", "a"]
    assert names(cluster="c2", team="vision") == ["d"]
    at = lambda h: datetime(2026, 11, 30, h, tzinfo=UTC)  # noqa: E731
    assert names(since=at(10)) == ["d", "c"]  # spans ending at 10:00 do not overlap [10:00, ...)
    assert names(until=at(9)) == ["a"]
    assert names(since=at(9), until=at(11)) == ["b", "c"]


def test_record_run(store: Store) -> None:
    w = Window(T0 - timedelta(hours=1), T0)
    r1 = store.record_run(w, T0, T0 + timedelta(seconds=3), jobs=12, queries=9, status="ok", detail={"warnings": []})
    r2 = store.record_run(w, T0, T0, jobs=0, queries=1, status="failed", detail={"error": "x", "at": T0})
    assert r2 > r1
    with store._engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT status, jobs, queries FROM audit_runs ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [("ok", 12, 9), ("failed", 0, 1)]


# ---------------------------------------------------------------------- retention


def test_retention_deletes_old_buckets_summaries_and_orphan_jobs(store: Store, store_url: str) -> None:
    now = T0 + timedelta(days=60)
    old = store.upsert_job(job("old"), T0, T0 + W)
    mid = store.upsert_job(job("mid"), T0, now - timedelta(days=3))
    new = store.upsert_job(job("new"), now - timedelta(hours=1), now)
    store.replace_buckets(old, [bucket(start=T0)])
    store.replace_buckets(mid, [bucket(start=now - timedelta(days=3))])
    store.replace_buckets(new, [bucket(start=now - 2 * W), bucket(start=now - W)])
    store.save_summary(old, summary("old", start="2026-11-30T09:00:00Z", end="2026-11-30T09:05:00Z"))
    store.save_summary(mid, summary("mid", start=None, end=None, computed_at=(now - timedelta(days=3)).isoformat()))
    store.save_summary(new, summary("new", start=(now - timedelta(hours=1)).isoformat(), end=now.isoformat()))
    store.record_run(Window(T0, T0 + W), T0, T0 + W, jobs=1, queries=1, status="ok", detail={})

    deleted = store.apply_retention(now, bucket_retention=timedelta(days=2), summary_retention=timedelta(days=30))
    # old: bucket + pod ownership + summary + job + its run; mid: bucket (3 days > 2) + pod ownership
    assert deleted == 1 + 1 + 1 + 1 + 1 + 1 + 1
    assert store.find_job("ml", "PyTorchJob", "old") is None
    assert store.buckets(mid) == [] and len(store.buckets(new)) == 2
    assert sorted(s["job"] for s in store.summaries()) == ["PyTorchJob/mid", "PyTorchJob/new"]
    assert count_rows(store_url, "audit_runs") == 0
    # idempotent
    assert store.apply_retention(now, bucket_retention=timedelta(days=2), summary_retention=timedelta(days=30)) == 0
    # the summary without a span ages out by computed_at; then its job has nothing left
    later = now + timedelta(days=30)
    assert store.apply_retention(later, bucket_retention=timedelta(days=2), summary_retention=timedelta(days=30)) >= 2
    assert store.find_job("ml", "PyTorchJob", "mid") is None
    with pytest.raises(BadInput, match="bucket_retention must be positive"):
        store.apply_retention(now, bucket_retention=timedelta(0), summary_retention=timedelta(days=1))


def test_batch_commits_once_and_a_failed_call_undoes_only_itself(store: Store, store_url: str) -> None:
    with store.batch():
        jid = store.upsert_job(job(), T0, T0)
        store.replace_buckets(jid, [bucket()])
        with pytest.raises(StoreError, match="foreign key|violates|FOREIGN KEY"):
            store.replace_buckets(999999, [bucket()])  # fails inside the database
        store.save_summary(jid, summary())
        with store.batch():  # nested: joins
            store.replace_buckets(jid, [bucket(gpu="GPU-b")])
        assert len(store.buckets(jid)) == 2  # the batch sees its own writes
    assert len(store.buckets(jid)) == 2 and store.summary(jid) == summary()

    # an exception that leaves the batch rolls all of it back
    with pytest.raises(RuntimeError, match="boom"):
        with store.batch():
            store.replace_buckets(jid, [bucket(gpu="GPU-c")])
            store.save_summary(jid, summary(verdict="idle"))
            raise RuntimeError("boom")
    assert len(store.buckets(jid)) == 2 and store.summary(jid)["verdict"] == "healthy"


def test_threads_can_share_one_store(store: Store) -> None:
    jid = store.upsert_job(job(), T0, T0)
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            store.replace_buckets(jid, [bucket(gpu=f"GPU-{i}", start=T0 + k * W) for k in range(20)])
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.buckets(jid)) == 80
