"""The efficiency gate's decision time: from a Workload's quota reservation to our check's answer.

Kueue holds a Workload's quota while our AdmissionCheck is Pending, so the gate must answer fast
(issue 16: p99 < 100 ms). This runs the real controller (auditor/gate) against the test bed's real
Kueue and PostgreSQL: a store seeded with the history of ``--lineages`` lineages (5 runs each, a
third of them flagged by the hold rule, so observe mode words a would-hold message for them), a
ClusterQueue with room for every job and the gate's AdmissionCheck, then ``--jobs`` one-GPU Jobs
submitted ``--every`` seconds apart. A watch on the Workloads (its own connection) timestamps the
first version showing ``QuotaReserved=True`` and the first showing our check answered: that
difference is the figure, as a Kueue user would see it. The controller's own timings (from its
watch event to the status write, and the store read + decision alone) are reported beside it.

    .venv/bin/python bench/gate_latency.py --jobs 300 --out bench/results --tag load2

``--status-write both`` (the default) writes the even jobs' answers by JSON patch of our entry and
the odd ones' by server-side apply (the gate's way), so the two are compared in one run under the
same load; the table by status write gives each one's figures.

Reuses a healthy running test bed (``make testbed-up``), else starts one; writes
``gate-latency-<date>[-<tag>].{json,md}`` into ``--out``. The Kueue objects (flavors, ClusterQueue,
LocalQueue, AdmissionCheck, Jobs) come from the tests' helpers (tests/kueue_objects.py). Run it alone: any other gate controller running
against the bed (a gate test's) answers the bench's checks too. ``--all-flavors`` runs the check
on every flavor, so Kueue puts it on each Workload at creation and the gate may answer before the
quota reservation; the breakdown rows cut the watcher's view at the controller's own timestamps.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # the tests' Kueue helpers make the objects

from gate_objects import cluster_queue, gate_queue, gpu_job, is_true, until  # noqa: E402

from auditor.core.gate import GateAction, GateRule, LineageRun  # noqa: E402
from auditor.core.lineage import LineageKey  # noqa: E402
from auditor.gate.admission import AdmissionGate, GateSettings  # noqa: E402
from auditor.gate.controller import ControllerConfig, GateController  # noqa: E402
from auditor.gate.stage import core_decide  # noqa: E402
from auditor.kube.client import call_json, resource_path  # noqa: E402

RULES = [GateRule("hold-low-sm", GateAction.HOLD, verdicts=frozenset({"low_sm_efficiency"}), at_least=3, of_last=5)]


def log(msg: str) -> None:
    print(f"[bench {datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def seed(store: Any, namespace: str, lineages: int, now: datetime) -> None:
    from auditor.store.lineage import LineageRecorder

    rec = LineageRecorder(store)
    for i in range(lineages):
        key = LineageKey("default", namespace, f"train{i}")
        flagged = i % 3 == 0
        for r in range(5):
            start = now - timedelta(days=5 - r)
            verdict = "low_sm_efficiency" if flagged and r != 2 else "healthy"
            rec.record(key, LineageRun(job=f"Job/train{i}-old{r}", verdict=verdict, start=start, end=start), now)


class Watcher:
    """Timestamps, per Workload, the first version with quota reserved and the first answered by us."""

    def __init__(self, kubeconfig: str, ns: str, check: str) -> None:
        from kubernetes import client, config, watch

        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.reserved: dict[str, float] = {}
        #: first version with quota reserved *and* our check Pending: the earliest the gate can act
        self.pending: dict[str, float] = {}
        self.admitted: dict[str, float] = {}
        self.answered: dict[str, tuple[float, str]] = {}
        self._w = watch.Watch()
        custom = client.CustomObjectsApi(self.api)

        def run() -> None:
            try:
                for ev in self._w.stream(
                    custom.list_namespaced_custom_object,
                    "kueue.x-k8s.io",
                    "v1beta2",
                    ns,
                    "workloads",
                    timeout_seconds=3600,
                ):
                    t = time.monotonic()
                    o = ev["object"]
                    name = o["metadata"]["name"]
                    st = o.get("status") or {}
                    if name not in self.reserved and any(
                        c["type"] == "QuotaReserved" and c["status"] == "True" for c in st.get("conditions") or []
                    ):
                        self.reserved[name] = t
                    if name not in self.admitted and any(
                        c["type"] == "Admitted" and c["status"] == "True" for c in st.get("conditions") or []
                    ):
                        self.admitted[name] = t
                    for c in st.get("admissionChecks") or []:
                        if c["name"] == check and c.get("state") == "Pending":
                            self.pending.setdefault(name, t)
                        if (
                            c["name"] == check
                            and c.get("state") in ("Ready", "Rejected", "Retry")
                            and name not in self.answered
                        ):
                            self.answered[name] = (t, c["state"])
            except Exception:  # noqa: BLE001 - stopped
                pass

        self._t = threading.Thread(target=run, daemon=True)
        self._t.start()

    def stop(self) -> None:
        self._w.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--lineages", type=int, default=500)
    ap.add_argument("--every", type=float, default=0.05, help="seconds between submissions")
    ap.add_argument("--out", type=Path, default=Path("/tmp/gate-bench"))
    ap.add_argument(
        "--all-flavors",
        action="store_true",
        help="the check on every flavor of the ClusterQueue (no onFlavors): Kueue adds it at creation, answered before quota",
    )
    ap.add_argument(
        "--status-write",
        choices=("both", "patch", "apply"),
        default="both",
        help="how check states are written: JSON patch, server-side apply (the gate's default), or both "
        "alternately (even jobs patch, odd jobs apply: before/after in one run, under the same load)",
    )
    ap.add_argument("--tag", default="", help="suffix of the result files' names (e.g. the load)")
    ap.add_argument(
        "--no-tell",
        action="store_true",
        help="diagnostic: skip the Job annotation and Event after each answer (how much they slow the status writes)",
    )
    args = ap.parse_args(argv)

    import psycopg
    from kubernetes import config as kc

    from auditor.store import Store
    from auditor.store.lineage import AckLog, LineageHistoryReader
    from auditor.testbed import up

    bed = up()
    api = kc.new_client_from_config(config_file=bed.kubeconfig)
    case = uuid.uuid4().hex[:6]
    ns, db = f"bench-gate-{case}", f"bench_gate_{case}"
    call_json(api, resource_path("v1", "namespaces"), method="POST", body={"metadata": {"name": ns}})
    with psycopg.connect(bed.postgres_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    base, _, _ = bed.postgres_admin_url.rpartition("/")
    store = Store.open(f"{base}/{db}")
    now = datetime.now(timezone.utc)
    t0 = time.monotonic()
    seed(store, ns, args.lineages, now)
    log(f"seeded {args.lineages} lineages × 5 runs in {time.monotonic() - t0:.1f} s")
    queue = gate_queue(api, ns, gpus=args.jobs + 10, on_flavors=not args.all_flavors)
    q = queue.__enter__()
    cq, ac = q.cluster_queue, q.check
    gate = AdmissionGate(
        LineageHistoryReader(store), core_decide, RULES, GateSettings(mode="observe", timeout=2.0), acks=AckLog(store)
    )
    ctl = GateController(api, gate, ControllerConfig(sweep_interval=3600), instance="bench").start()
    if args.no_tell:
        ctl._after = lambda *a, **k: None  # type: ignore[method-assign]
    #: Workload → how its answer was written (by its Job's index: j00004 even → patch)
    how: dict[str, str] = {}
    write = ctl.kube.write_checks

    def write_by_index(view: Any, states: Any, **kw: Any) -> dict:
        owner = view.owner_name
        mode = args.status_write
        if mode == "both":
            mode = "patch" if owner[1:].isdigit() and int(owner[1:]) % 2 == 0 else "apply"
        how[view.name] = mode
        return write(view, states, how=mode)

    ctl.kube.write_checks = write_by_index  # type: ignore[method-assign]
    watcher = Watcher(bed.kubeconfig, ns, ac)
    try:
        assert ctl.wait_synced(60)
        until(lambda: is_true(cluster_queue(api, cq), "Active"), "the ClusterQueue Active", 60)
        rng = random.Random(7)
        load_before = os.getloadavg()
        t_submit = time.monotonic()
        for i in range(args.jobs):
            gpu_job(api, ns, f"j{i:05d}", lineage=f"train{rng.randrange(args.lineages)}")
            time.sleep(args.every)
        deadline = time.monotonic() + 120
        while len(watcher.answered) < args.jobs and time.monotonic() < deadline:
            time.sleep(0.2)
        submit_s = time.monotonic() - t_submit
        seen = [w for w in watcher.answered if w in watcher.reserved]
        # answered before quota: Kueue admits at the reservation; the gate's share is then 0
        lat = [max(0.0, watcher.answered[w][0] - watcher.reserved[w]) * 1000 for w in seen]
        early = sum(1 for w in seen if watcher.answered[w][0] < watcher.reserved[w])
        to_admitted = [
            max(0.0, watcher.admitted[w] - watcher.reserved[w]) * 1000 for w in seen if w in watcher.admitted
        ]
        inner = [d.seconds * 1000 for d in ctl.decided]
        decide = [d.decide_seconds * 1000 for d in ctl.decided]
        write = [d.write_seconds * 1000 for d in ctl.decided]
        by_wl = {d.workload: d for d in ctl.decided}
        both = [w for w in seen if w in by_wl and w in watcher.pending]
        # the watcher's view, cut at the controller's own timestamps (one process, one monotonic clock)
        kueue_steps = [max(0.0, watcher.pending[w] - watcher.reserved[w]) * 1000 for w in both]
        our_watch = [((by_wl[w].wrote_at - by_wl[w].seconds) - watcher.pending[w]) * 1000 for w in both]
        queued = [d.queued_seconds * 1000 for d in ctl.decided]
        back = [(watcher.answered[w][0] - by_wl[w].wrote_at) * 1000 for w in both]
        owner_reads = sum(1 for d in ctl.decided if d.owner_read)
        states: dict[str, int] = {}
        for d in ctl.decided:
            k = d.state + (" (would hold)" if d.would == "hold" else "")
            states[k] = states.get(k, 0) + 1

        def row(xs: list[float]) -> dict[str, float]:
            if not xs:
                return {"n": 0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
            return {
                "n": len(xs),
                "p50": round(statistics.median(xs), 1),
                "p90": round(pct(xs, 90), 1),
                "p99": round(pct(xs, 99), 1),
                "max": round(max(xs), 1),
            }

        result = {
            "date": now.date().isoformat(),
            "jobs": args.jobs,
            "lineages": args.lineages,
            "every_s": args.every,
            "submit_and_answer_s": round(submit_s, 1),
            "states": states,
            "check_on": "every flavor" if args.all_flavors else "the GPU flavor (onFlavors)",
            "answered_before_quota": early,
            "quota_reserved_to_check_answered_ms": row(lat),
            "quota_reserved_to_admitted_ms": row(to_admitted),
            "controller_event_to_status_written_ms": row(inner),
            "store_read_and_decision_ms": row(decide),
            "status_apply_ms": row(write),
            "kueue_reserved_to_check_pending_ms": row(kueue_steps),
            "check_pending_to_controller_event_ms": row(our_watch),
            "controller_queue_wait_ms": row(queued),
            "status_written_to_watcher_sees_it_ms": row(back),
            "by_status_write": {
                mode: {
                    "controller_event_to_status_written_ms": row(
                        [d.seconds * 1000 for d in ctl.decided if how.get(d.workload) == mode]
                    ),
                    "status_write_ms": row(
                        [d.write_seconds * 1000 for d in ctl.decided if how.get(d.workload) == mode]
                    ),
                    "quota_reserved_to_check_answered_ms": row(
                        [
                            max(0.0, watcher.answered[w][0] - watcher.reserved[w]) * 1000
                            for w in seen
                            if how.get(w) == mode
                        ]
                    ),
                }
                for mode in ("patch", "apply")
                if mode in how.values()
            },
            "owner_reads_from_api": owner_reads,
            "unanswered": args.jobs - len(watcher.answered),
            "load_average_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "cpus": os.cpu_count(),
        }
    finally:
        watcher.stop()
        ctl.stop()
        gate.close()
        store.close()
        queue.__exit__(None, None, None)
        call_json(api, resource_path("v1", "namespaces", None, ns), method="DELETE")
        with psycopg.connect(bed.postgres_admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "".join(f"-{t}" for t in (args.tag, "all-flavors" if args.all_flavors else "") if t)
    stem = args.out / f"gate-latency-{result['date']}{tag}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        f"# Gate decision latency, {result['date']}",
        "",
        f"{args.jobs} one-GPU Jobs, one every {args.every:g} s, {args.lineages} lineages of history in PostgreSQL "
        f"(test bed, real Kueue v0.17.0), observe mode, the check on {result['check_on']}; "
        f"{result['answered_before_quota']} answered before their quota reservation.",
        "",
        "| measured | n | p50 ms | p90 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|",
    ]
    for label, key in (
        (
            "QuotaReserved seen → check answered seen (a watcher's view; 0 if answered before)",
            "quota_reserved_to_check_answered_ms",
        ),
        ("QuotaReserved seen → Admitted seen (a watcher's view)", "quota_reserved_to_admitted_ms"),
        ("controller: its watch event → status written", "controller_event_to_status_written_ms"),
        ("controller: store read + decision", "store_read_and_decision_ms"),
        ("controller: the status write", "status_apply_ms"),
        ("breakdown: QuotaReserved → our check Pending (Kueue's second write)", "kueue_reserved_to_check_pending_ms"),
        ("breakdown: check Pending seen by the watcher → by the controller", "check_pending_to_controller_event_ms"),
        ("breakdown: controller work queue wait", "controller_queue_wait_ms"),
        ("breakdown: status written → the watcher sees it", "status_written_to_watcher_sees_it_ms"),
    ):
        r = result[key]
        md.append(f"| {label} | {r['n']} | {r['p50']} | {r['p90']} | {r['p99']} | {r['max']} |")
    if result["by_status_write"]:
        md += [
            "",
            "By how the check state was written (server-side apply: the gate's way; JSON patch of our entry: the alternative)",
            "",
            "| status write | measured | n | p50 ms | p90 ms | p99 ms | max ms |",
            "|---|---|---|---|---|---|---|",
        ]
        for mode, rows in result["by_status_write"].items():
            for label, key in (
                ("QuotaReserved seen → check answered seen", "quota_reserved_to_check_answered_ms"),
                ("controller: its watch event → status written", "controller_event_to_status_written_ms"),
                ("controller: the status write", "status_write_ms"),
            ):
                r = rows[key]
                md.append(
                    f"| {'JSON patch' if mode == 'patch' else 'server-side apply'} | {label} | {r['n']} | "
                    f"{r['p50']} | {r['p90']} | {r['p99']} | {r['max']} |"
                )
    md += [
        "",
        f"States written: {result['states']}; unanswered: {result['unanswered']}; owner Jobs read from the API "
        f"(not yet in the gate's Jobs cache): {result['owner_reads_from_api']}. Machine: {result['cpus']} CPUs, "
        f"1-minute load average {result['load_average_1m_before_after'][0]} before, "
        f"{result['load_average_1m_before_after'][1]} after (apiserver, etcd, Kueue, PostgreSQL and the gate share them).",
    ]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
