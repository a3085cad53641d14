"""Lineage history read + gate decision latency on a PostgreSQL (the bed's): what one admission costs.

Usage: set -a; . .testbed/env; set +a; .venv/bin/python bench/lineage_history.py
Creates a scratch database next to $DATABASE_URL's (dropped at the end), fills 2,000 lineages x 40 runs
(every tenth acknowledged), then times LineageHistoryReader.history + decide for 3,000 random lineages.
"""

import os
import random
import time
from datetime import datetime, timedelta, timezone
from urllib.parse import urlsplit, urlunsplit

import psycopg

from auditor.core.gate import GateAction, GateMode, GateRule, decide
from auditor.core.lineage import LineageKey
from auditor.store.lineage import AckLog, LineageHistoryReader
from auditor.store.lineage_tables import lineage_id_of, lineage_runs
from auditor.store.store import Store

url = os.environ["DATABASE_URL"]
p = urlsplit(url)
admin = urlunsplit((p.scheme, p.netloc, "/postgres", p.query, ""))
name = f"bench_lineage_{os.getpid()}"
with psycopg.connect(admin, autocommit=True) as c:
    c.execute(f'CREATE DATABASE "{name}"')
try:
    store = Store.open(urlunsplit((p.scheme, p.netloc, "/" + name, p.query, "")))
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    L, R = 2000, 40
    t = time.perf_counter()
    with store.writing("fill") as conn:
        for i in range(L):
            key = LineageKey("c1", f"ns{i % 50}", f"job{i}")
            lid = lineage_id_of(conn, key, now)
            conn.execute(
                lineage_runs.insert(),
                [
                    dict(
                        lineage_id=lid,
                        job_kind="Job",
                        job_name=f"job{i}-{r:05d}",
                        job_uid="",
                        verdict=random.choice(["healthy", "low_sm_efficiency", "idle"]),
                        findings=[],
                        start=now - timedelta(hours=R - r),
                        end=None,
                        gpu_hours=1.0,
                        waste_gpu_hours=0.5,
                        final=True,
                        recorded_at=now,
                    )
                    for r in range(R)
                ],
            )
    print(f"filled {L} lineages x {R} runs in {time.perf_counter() - t:.1f} s")
    log = AckLog(store)
    for i in range(0, L, 10):
        log.acknowledge(LineageKey("c1", f"ns{i % 50}", f"job{i}"), "bench", None, "", now)
    reader = LineageHistoryReader(store)
    rules = [
        GateRule("h", GateAction.HOLD, verdicts=frozenset({"low_sm_efficiency"}), at_least=3, of_last=5),
        GateRule("p", GateAction.DEPRIORITIZE, verdicts=frozenset({"idle"}), within=timedelta(days=7)),
    ]
    times = []
    for _ in range(3000):
        i = random.randrange(L)
        key = LineageKey("c1", f"ns{i % 50}", f"job{i}")
        t = time.perf_counter()
        decide(reader.history(key, now), rules, GateMode.ENFORCE, now)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    print(
        f"history+decide over {len(times)} lookups: p50 {times[len(times) // 2]:.2f} ms, p99 {times[int(len(times) * 0.99)]:.2f} ms, max {times[-1]:.2f} ms"
    )
    store.close()
finally:
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
