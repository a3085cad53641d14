"""House rules that ruff, mypy and import-linter cannot hold (issue 31, step 5), run by ``make lint``.

- **Size budgets**: a module of ``auditor/`` at most ``module_lines`` lines, a function at most
  ``function_lines``; what is over today is listed in ``tools/house_rules.toml`` with its ceiling
  and the reason, and that list can only shrink: an entry over its ceiling fails, and so does one
  back within the budget (delete it then).
- **Time from the Clock**: no ``datetime.now``/``utcnow``, ``time.time`` or ``time.monotonic``
  call outside ``auditor/clock.py`` (tests inject ``now`` through the Clock; a read elsewhere is
  a clock a test cannot move).
- **One timestamp formatter**: no RFC 3339 instant spelled by hand (``strftime("%Y-%m-%dT…")``,
  ``.isoformat().replace(…)``, ``.isoformat(timespec=…)``) outside ``auditor/core/rfc3339.py``.
- **Kubernetes errors in one layer**: ``ApiException`` only under ``auditor/kube/``.

The last three list today's exceptions per file with a count ceiling, shrinking like the sizes.
``auditor/testbed/`` (the test bed, not product code) is outside every rule.

    python tools/house_rules.py            # exit 1 and one line per breach
    python tools/house_rules.py --suggest  # today's offenders as TOML entries (to start a list)
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "tools" / "house_rules.toml"
EXEMPT = ("auditor/testbed/",)

#: rule name → (what is counted, the modules where it is at home)
CALL_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "clock_reads": ("a clock read outside the Clock", ("auditor/clock.py",)),
    "timestamp_formats": ("a hand-made timestamp", ("auditor/core/rfc3339.py",)),
    "api_exceptions": ("ApiException outside auditor/kube/", ("auditor/kube/",)),
}
CLOCK_CALLS = {("datetime", "now"), ("datetime", "utcnow"), ("time", "time"), ("time", "monotonic")}


def _hand_made_timestamp(call: ast.Call) -> bool:
    """An RFC 3339 instant spelled by hand: ``strftime("%Y-%m-%dT...")``, or ``.isoformat()``
    made into one (``.isoformat().replace("+00:00", "Z")``, ``.isoformat(timespec=...)``); a
    date's ``isoformat()`` (a week's first day) is no instant and passes."""
    func = call.func
    assert isinstance(func, ast.Attribute)
    if func.attr == "strftime":
        fmt = call.args[0] if call.args else None
        return isinstance(fmt, ast.Constant) and isinstance(fmt.value, str) and "%Y-%m-%dT" in fmt.value
    if func.attr == "replace" and isinstance(func.value, ast.Call):
        inner = func.value.func
        return isinstance(inner, ast.Attribute) and inner.attr == "isoformat"
    return func.attr == "isoformat" and any(k.arg == "timespec" for k in call.keywords)


def _sources() -> list[tuple[str, ast.Module, int]]:
    out = []
    for path in sorted((REPO / "auditor").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(EXEMPT):
            continue
        text = path.read_text()
        out.append((rel, ast.parse(text, rel), text.count("\n")))
    return out


def _calls(tree: ast.Module) -> Counter[str]:
    """How often each rule's pattern appears in one module."""
    found: Counter[str] = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, owner = node.func.attr, node.func.value
            # the module's ``time.monotonic()`` or ``datetime.now()`` (also spelled
            # ``datetime.datetime.now()``), not ``self.clock.monotonic()`` on a Clock
            owner_name = (
                owner.id
                if isinstance(owner, ast.Name)
                else owner.attr
                if isinstance(owner, ast.Attribute)
                and isinstance(owner.value, ast.Name)
                and owner.value.id == "datetime"
                else ""
            )
            if (owner_name, attr) in CLOCK_CALLS:
                found["clock_reads"] += 1
            elif _hand_made_timestamp(node):
                found["timestamp_formats"] += 1
        if isinstance(node, ast.Name) and node.id == "ApiException":
            found["api_exceptions"] += 1
        if isinstance(node, ast.Attribute) and node.attr == "ApiException":
            found["api_exceptions"] += 1
    return found


def measure() -> dict[str, dict[str, int]]:
    """Today's offenders of every rule: rule → {module or module:function → its count or size}."""
    cfg = tomllib.loads(CONFIG.read_text())["budget"]
    seen: dict[str, dict[str, int]] = {"modules": {}, "functions": {}, **{r: {} for r in CALL_RULES}}
    for rel, tree, lines in _sources():
        if lines > cfg["module_lines"]:
            seen["modules"][rel] = lines
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > cfg["function_lines"]:
                    key = f"{rel}:{node.name}"
                    seen["functions"][key] = max(size, seen["functions"].get(key, 0))
        for rule, n in _calls(tree).items():
            if not rel.startswith(CALL_RULES[rule][1]):
                seen[rule][rel] = n
    return seen


def breaches() -> list[str]:
    """One line per breach: something over its budget that is not listed, over its listed
    ceiling, or listed but no longer over the budget."""
    cfg = tomllib.loads(CONFIG.read_text())
    seen = measure()
    out: list[str] = []
    what = {
        "modules": f"module over {cfg['budget']['module_lines']} lines",
        "functions": f"function over {cfg['budget']['function_lines']} lines",
        **{r: w for r, (w, _home) in CALL_RULES.items()},
    }
    for rule, found in seen.items():
        allowed: dict[str, dict] = cfg.get(rule, {})
        for key, n in sorted(found.items()):
            entry = allowed.get(key)
            if entry is None:
                out.append(
                    f"{key}: {what[rule]} ({n}); split it, or list it in tools/house_rules.toml [{rule}] with the reason"
                )
            elif n > entry["max"]:
                out.append(f"{key}: {what[rule]}: {n}, above its listed ceiling {entry['max']} (the list only shrinks)")
        for key, entry in sorted(allowed.items()):
            if key not in found:
                out.append(f"{key}: listed in [{rule}] but within the rule now: delete the entry")
            elif found[key] < entry["max"]:
                out.append(f"{key}: [{rule}] ceiling {entry['max']} but it is {found[key]} now: lower the ceiling")
            if not str(entry.get("why", "")).strip():
                out.append(f"{key}: [{rule}] entry without a reason ('why')")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suggest", action="store_true", help="print today's offenders as TOML entries")
    args = ap.parse_args(argv)
    if args.suggest:
        for rule, found in measure().items():
            print(f"\n[{rule}]")
            for key, n in sorted(found.items(), key=lambda kv: -kv[1]):
                print(f'"{key}" = {{ max = {n}, why = "" }}')
        return 0
    lines = breaches()
    for line in lines:
        print(line)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
