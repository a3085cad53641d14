"""``gpu-auditor policy validate FILE|DIR`` and ``gpu-auditor policy simulate --since 7d``.

``validate`` checks one policy file or every policy file of a directory (exit 2 with
``file:line`` on the first bad one) and runs the example suites found next to them.
``simulate`` backtests policies over the stored summaries and buckets without any side effect.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import IO, Mapping, Sequence

from auditor.cli.output import add_output_flag
from auditor.cli.storeopts import add_store_flags
from auditor.errors import BadInput
from auditor.render.safe_text import terminal_safe
from auditor.timeparse import parse_duration

#: the shipped policies (repository checkout); the image installs them at the same relative place
DEFAULT_POLICIES = Path(__file__).resolve().parents[2] / "policies"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("policy", help="validate policies, or backtest them over stored history")
    sub = p.add_subparsers(dest="policy_command", metavar="COMMAND", required=True)
    v = sub.add_parser("validate", help="check policy files (exit 2 with file:line on an error)")
    v.add_argument(
        "path", metavar="FILE|DIR", help="a policy file, or a directory of policy YAML files (searched recursively)"
    )
    v.add_argument("--no-suites", action="store_true", help="do not run the example suites (suite.yaml)")
    v.set_defaults(handler=validate)
    s = sub.add_parser(
        "simulate", help="backtest: which jobs each policy would have hit, with which actions (no side effects)"
    )
    s.add_argument("--since", default="7d", metavar="DURATION", help="how far back (default 7d)")
    add_store_flags(s)
    s.add_argument(
        "--policies",
        metavar="DIR",
        help="policies to try (default: the operator's, from the settings: the shipped ones and policies.dir)",
    )
    add_output_flag(s, "the backtest", ("text", "json"))
    s.set_defaults(handler=simulate)


def validate(args: argparse.Namespace) -> int:
    from auditor.policy.examples import run_suite
    from auditor.policy.loader import load_all, parse_policies, read_path, shipped_overrides
    from auditor.policy.schema import GatePolicy

    files = read_path(args.path)
    if not files:
        raise BadInput(f"{args.path}: no policy files (*.yaml, *.yml) in it")
    documents = load_all(files)
    policies = [p for p in documents if not isinstance(p, GatePolicy)]
    failures: list[str] = []
    if not args.no_suites:
        for path, text in files.items():
            ps = parse_policies(text, path)
            suite = Path(path).with_name("suite.yaml")
            if suite.exists() and len(ps) == 1:
                failures += run_suite(ps[0], suite)
    for d in documents:
        if isinstance(d, GatePolicy):
            print(f"ok  {d.name}  ({d.describe()})")
        else:
            print(f"ok  {d.name}  (mode {d.spec.mode.value}, {len(d.spec.escalation)} step(s))")
    for line in shipped_overrides(files, DEFAULT_POLICIES):  # as the operator will run them
        print(line)
    for f in failures:
        print(f"suite failure: {f}", file=sys.stderr)
    if failures:
        return 1
    gates = len(documents) - len(policies)
    also = f" and {gates} gate rule{'' if gates == 1 else 's'}" if gates else ""
    print(f"{len(policies)} polic{'y' if len(policies) == 1 else 'ies'}{also} valid")
    return 0


def simulate(args: argparse.Namespace) -> int:
    """Backtest over the store and the policies the operator uses (its settings sources), unless
    ``--db``/``--policies`` name others; a store without jobs is an error (exit 1)."""
    from auditor import compose
    from auditor.cli.storeopts import command_settings, open_store, require_jobs
    from auditor.operator_loop.policies import policy_files
    from auditor.policy.backtest import simulate as backtest
    from auditor.policy.backtest import simulate_gate
    from auditor.policy.loader import load_all, read_dir
    from auditor.policy.schema import GatePolicy, Policy
    from auditor.store.lineage import LineageHistoryReader

    since = parse_duration(args.since, what="--since")
    settings = command_settings(args)
    documents = load_all(read_dir(args.policies) if args.policies else policy_files(settings))
    policies = [p for p in documents if isinstance(p, Policy)]
    gates = [p for p in documents if isinstance(p, GatePolicy)]
    if not documents:
        raise BadInput("no policies to simulate (give --policies DIR, or set policies.dir / policies.builtin)")
    now = compose.clock().now()
    store = open_store(settings, read_only=True)
    try:
        require_jobs(store)
        result = {"store": store.display_url, **backtest(store, policies, since=now - since, until=now)}
        if gates:
            histories = LineageHistoryReader(store).histories(cluster=settings.cluster)
            result["gate"] = simulate_gate(histories, gates, since=now - since, until=now)
    finally:
        store.close()
    if args.output == "json":
        print(json.dumps(result, indent=2, default=str))
        return 0
    print(
        f"backtest over {result['jobs']} stored job(s) since {result['since']} in store {result['store']} (no side effects)"
    )
    for name, pol in result["policies"].items():
        print(
            f"\n{name} (mode {pol['mode']}): {len(pol['hits'])} job(s) hit, {pol['alerts']} alert(s), {pol['requeues']} requeue(s)"
        )
        for day, c in sorted(pol["per_day"].items()):
            print(f"  {day}: {c['alerts']} alert(s), {c['requeues']} requeue(s), {c['hits']} job(s)")
        for h in pol["hits"][:20]:
            print(f"  {h['job']}: {h['reason']} → {', '.join(h['actions']) or 'no action yet'}")
        print_near_misses(pol["near_misses"])
    if "gate" in result:
        print_gate_simulation(result["gate"])
    return 0


def print_near_misses(near: Sequence[Mapping], limit: int = 10) -> None:
    """The jobs a policy missed by one condition, most GPU-hours lost first: what a threshold lets
    through, so that the admin who set it sees by how much (docs/policies.md, "Near misses")."""
    if not near:
        return
    print(f"  near misses ({len(near)}: failed one condition, most GPU-hours lost first):")
    for n in near[:limit]:
        lost = n["lost_gpu_hours"]
        value, threshold = n["value"], n["threshold"]
        got = "" if value is None else f": {_figure(value)} vs {_figure(threshold)}"
        print(
            terminal_safe(
                f"    {n['job']} ({'-' if lost is None else f'{lost:.2f}'} GPU-h lost) "
                f"misses {n['condition']}{got} ({n['reason']})"
            )
        )
    if len(near) > limit:
        print(f"    … and {len(near) - limit} more (-o json lists them all)")


def _figure(v: object) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def print_gate_simulation(gate: dict) -> None:
    """What the gate rules would have done in ``enforce`` (``policy simulate``'s text output)."""
    print(f"\ngate: {gate['submissions']} submission(s) of {gate['lineages']} lineage(s) replayed (as in enforce)")
    for name, rule in gate["rules"].items():
        verb = "held" if rule["action"] == "hold" else "deprioritized"
        print(f"\n{name} ({rule['describe']}): {len(rule['hits'])} submission(s) {verb}")
        for day, n in sorted(rule["per_day"].items()):
            print(f"  {day}: {n}")
        for h in rule["hits"][:20]:
            print(f"  {h['lineage']} {h['job']} at {h['submitted']}: {'; '.join(h['evidence'])}")


#: the CLI's name for the webhook HMAC key before it took the chart's: refused, so that a key set
#: under it is not silently dropped (webhooks would go out unsigned, i.e. not at all)
RETIRED_WEBHOOK_KEY_ENV = "GPU_AUDITOR_WEBHOOK_SECRET"


def runner_config_from_env(cluster: str = "default", environ: Mapping[str, str] | None = None):  # -> RunnerConfig
    """The operator's runner config (:func:`auditor.policy.config.runner_config`) over the variables
    the Helm chart sets: GPU_AUDITOR_SLACK_WEBHOOK_URL, GPU_AUDITOR_WEBHOOK_URL and
    GPU_AUDITOR_WEBHOOK_HMAC_KEY (never from flags: they are secrets). BadInput (exit 2) while
    the retired GPU_AUDITOR_WEBHOOK_SECRET is set."""
    from auditor.policy.config import WEBHOOK_HMAC_KEY_ENV, chart_notifications, runner_config
    from auditor.settings import Settings

    env = os.environ if environ is None else environ
    if RETIRED_WEBHOOK_KEY_ENV in env:
        raise BadInput(
            f"{RETIRED_WEBHOOK_KEY_ENV} is no longer read: put the webhook HMAC key in "
            f"{WEBHOOK_HMAC_KEY_ENV} (the Helm chart's name) and unset {RETIRED_WEBHOOK_KEY_ENV}"
        )
    return runner_config(Settings(cluster=cluster, notifications=chart_notifications()), env)


def print_decisions(decisions: Sequence, *, act: bool, file: IO[str]) -> int:
    """A short human list of the decisions of one cycle, each with what became of it (a failed
    or undelivered alert says so); returns how many went wrong (the command then exits 1)."""
    if not decisions:
        print("policies: no job breaks a policy", file=file)
        return 0
    wrong = 0
    for d in decisions:
        ok, _ = d.outcome()
        wrong += not ok
        line = f"policy {d.policy} on {d.job}: {d.reason} → step {d.step}: {d.summary_line()}"
        print(terminal_safe(line), file=file)  # the job's name and the reason come from the cluster
    if not act:
        print("policies: dry run; add --act to carry out the actions", file=file)
    elif wrong:
        print(f"policies: {wrong} decision(s) not carried out in full; see `gpu-auditor actions`", file=file)
    return wrong
