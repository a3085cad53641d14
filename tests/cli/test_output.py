"""``-o table|wide|json|yaml`` on the commands that print jobs (kubectl's convention)."""

import io
import json
from pathlib import Path

import pytest
import yaml

from auditor.cli.main import build_parser
from auditor.cli.output import print_jobs
from auditor.core.job_summary import JobSummary

DOCS = json.loads((Path(__file__).parents[1] / "golden/audit/demo.json").read_text())
SUMMARIES = [JobSummary.from_json(d) for d in DOCS]


def _out(fmt: str) -> str:
    buf = io.StringIO()
    print_jobs(SUMMARIES, DOCS, fmt, buf)
    return buf.getvalue()


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", "--no-kube", "--start", "now-1h", "-o", "wide"],
        ["audit", "--no-kube", "--start", "now-1h", "--output", "yaml"],
        ["run", "--once", "-o", "json"],
    ],
)
def test_job_commands_take_kubectl_output_formats(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).output in ("wide", "yaml", "json")


def test_json_is_the_audit_json_and_yaml_the_same_documents() -> None:
    assert json.loads(_out("json")) == DOCS  # the contract, unchanged
    assert yaml.safe_load(_out("yaml")) == DOCS
    assert max(len(line) for line in _out("table").splitlines()) <= 120
    # the MFU estimate is in both (issue 28); wide adds team, tensor, DRAM, the reference, coverage
    assert "MFU~" in _out("table") and "DRAM" in _out("wide") and "DRAM" not in _out("table")
