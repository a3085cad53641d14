"""The operator with a hung alert receiver (issue 20, "slow receivers"): its cycle sends nothing
and takes no longer for it; the delivery pass beside it is bounded and, once the receiver is
back, delivers every alert once.

One operator on the test bed's real apiserver with three replayed one-SM spins as its source
(pods not in the API, audited as ``Pod/<name>``) and a SQLite store, its webhook through the
fault proxy to a real local receiver; timeouts set short through ``notifications``.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

from faultproxy import Fault
from operator_settings import NOTIFY_LOW_SM, operator_settings

from auditor.core.model import PodRef
from auditor.operator_loop import Operator
from auditor.sources.replay import ReplaySource
from auditor.traces import TraceJob, load_trace, make_gpus


def test_a_hung_receiver_never_holds_up_the_operators_cycle(
    kube_admin, tmp_path, monkeypatch, fault_proxy, receiver
) -> None:
    ns = f"dq-{uuid.uuid4().hex[:8]}"
    now = datetime.now(timezone.utc).replace(microsecond=0)
    trace = load_trace("h200-microbench")
    jobs = [TraceJob(PodRef(ns, n, "main"), make_gpus(1, f"{ns}-{n}"), "one_sm_spin") for n in ("a", "b", "c")]
    source = ReplaySource([(trace, jobs)], end=now, duration=timedelta(minutes=30))
    proxy = fault_proxy(receiver.url).always(Fault.hang(10))
    monkeypatch.setenv("DQ_HOOK_URL", proxy.url)
    monkeypatch.setenv("DQ_HOOK_KEY", "k")
    settings = operator_settings(
        tmp_path,
        policy=NOTIFY_LOW_SM,
        notifications={
            "webhook": {"url_env": "DQ_HOOK_URL", "hmac_key_env": "DQ_HOOK_KEY"},
            "timeout": "500ms",
            "deadline": "1s",
        },
    )
    op = Operator(settings, source=source, api=kube_admin)
    try:
        op.start(http=False)
        result = op.cycle()
        assert result is not None
        mine = [d for d in result.decisions if f"/{ns}/" in d.job]
        assert len(mine) == 3 and {d.results["notify"]["state"] for d in mine} == {"queued"}
        assert proxy.requests == [], "the cycle itself sent nothing"

        t = time.monotonic()
        hung = op.deliver()
        took = time.monotonic() - t
        assert len(hung.retrying) == 3 and took < 2.0, (hung, took)  # one timeout for the one receiver

        proxy.always(None)
        later = op.deliver()
        assert sorted(later.sent) == sorted(hung.retrying) and not later.failed
        assert op.deliver().tried == 0
    finally:
        op.shutdown()
    keys = [r.headers["Idempotency-Key"] for r in receiver.accepted]
    assert len(keys) == 3 and len(set(keys)) == 3, "each alert once"
