"""Hostile YAML in policies and settings: bounded memory, one clear line, nothing re-parsed needlessly.

The operator re-reads its policy directory (a ConfigMap anyone with edit rights can change) every
cycle; a 342-byte "billion laughs" file used to drive ``policy validate`` to 14.5 GB.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from auditor.errors import BadInput
from auditor.policy import loader
from auditor.policy.loader import PolicyRegistry, parse_policies
from auditor.settings import load_settings
from auditor.yamldoc import MAX_VALUES, YamlError, load_documents

# Nine levels of nine aliases: 9**9 (387 million) strings once expanded; 342 bytes as written.
LAUGHS = """a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""

POLICY = (Path(__file__).parents[2] / "policies" / "idle-gpus" / "policy.yaml").read_text()


def test_the_bomb_is_small_and_refused_with_its_line() -> None:
    assert len(LAUGHS) == 342
    with pytest.raises(YamlError, match=r"more than 100,000 values") as err:
        load_documents(LAUGHS, "bomb.yaml")
    assert 1 <= err.value.line <= 9


def test_aliases_within_the_bound_still_work() -> None:
    (doc,) = load_documents("base: &b {x: 1}\nuse: *b\nmerged: {<<: *b, y: 2}\n", "ok.yaml")
    assert doc.value == {"base": {"x": 1}, "use": {"x": 1}, "merged": {"x": 1, "y": 2}}
    assert MAX_VALUES >= 10_000  # a real policy (~100 values) is far inside it


def _run_cli(*args: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], int]:
    """The CLI in a child process, with its peak RSS in MiB (its own, from getrusage)."""
    code = (
        "import sys\n"
        "from auditor.cli.main import main\n"
        "try:\n"
        f"    rc = main({list(args)!r})\n"
        "except SystemExit as e:\n"
        "    rc = e.code\n"
        # the child's own peak: ru_maxrss carries the parent's high-water mark across fork + exec
        "hwm = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        "sys.stderr.write(f'\\nRSS_KIB={hwm}\\n')\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    rss_kib = int(proc.stderr.rsplit("RSS_KIB=", 1)[1].split()[0])
    return proc, rss_kib // 1024


def test_policy_validate_of_a_bomb_exits_2_with_one_line_in_bounded_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(LAUGHS)
    proc, rss_mib = _run_cli("policy", "validate", str(bomb), tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"{bomb}:" in proc.stderr and "more than 100,000 values" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert rss_mib < 400, f"peak RSS {rss_mib} MiB"


def test_settings_bomb_duplicates_and_syntax_errors_name_file_and_line(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(LAUGHS)
    with pytest.raises(BadInput, match=r"bomb\.yaml:\d+: not valid YAML: the document expands"):
        load_settings(bomb, environ={})
    dup = tmp_path / "dup.yaml"
    dup.write_text("cluster: a\nretention:\n  buckets: 10d\ncluster: b\n")
    with pytest.raises(BadInput, match=r"dup\.yaml:4: not valid YAML: duplicate key 'cluster'"):
        load_settings(dup, environ={})
    broken = tmp_path / "broken.yaml"
    broken.write_text("cluster: a\nthresholds: [oops\n")
    with pytest.raises(BadInput) as err:
        load_settings(broken, environ={})
    assert str(err.value).startswith(f"settings file {broken}:") and "\n" not in str(err.value)
    two = tmp_path / "two.yaml"
    two.write_text("cluster: a\n---\ncluster: b\n")
    with pytest.raises(BadInput, match=r"two\.yaml:3: one YAML document expected"):
        load_settings(two, environ={})


def test_oversized_files_are_refused_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(BadInput, match=r"more than the 1,048,576 a policy file may have"):
        loader.read_path(big)
    with pytest.raises(BadInput, match=r"more than the 1,048,576 it may have"):
        load_settings(big, environ={})


def test_the_registry_parses_only_files_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = loader.parse_documents

    def counting(text: str, source: str):  # type: ignore[no-untyped-def]
        calls.append(source)
        return real(text, source)

    monkeypatch.setattr(loader, "parse_documents", counting)
    reg = PolicyRegistry()
    files = {"idle.yaml": POLICY, "bomb.yaml": LAUGHS}
    first = reg.update(files)
    assert sorted(calls) == ["bomb.yaml", "idle.yaml"]
    assert any("bomb.yaml" in p for p in first) and [p.name for p in reg.policies] == ["idle-gpus"]
    for _ in range(5):  # five unchanged cycles: nothing parsed, same answer
        assert reg.update(files) == first
    assert len(calls) == 2
    reg.update({**files, "idle.yaml": POLICY.replace("mode: warn", "mode: enforce")})
    assert calls[2:] == ["idle.yaml"]
    assert parse_policies(POLICY, "x.yaml")[0].name == "idle-gpus"


def test_bound_holds_within_this_process() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(3):
        with pytest.raises(YamlError):
            load_documents(LAUGHS, "bomb.yaml")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 100, grown_mib
