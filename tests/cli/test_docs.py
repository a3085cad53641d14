"""Every finding code the core emits is documented in docs/findings.md (the one place)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def emitted_codes() -> set[str]:
    src = "".join(p.read_text() for p in (ROOT / "auditor/core").glob("*.py"))
    return set(re.findall(r'Finding\(\s*"([a-z_]+)"', src))


def test_every_code_is_documented():
    codes = emitted_codes()
    assert len(codes) >= 20
    doc = (ROOT / "docs/findings.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", doc, flags=re.M))
    assert codes - documented == set()
    assert documented - codes == set()
