import json
from dataclasses import replace
from pathlib import Path

from auditor.core.identity import JobKey
from auditor.core.job_summary import JobSummary
from auditor.core.model import Finding, Verdict
from auditor.render.table import format_table, notes

#: a summary whose table cells the tests below set (every other field as a real audit writes it)
BASE = JobSummary.from_json(json.loads((Path(__file__).parents[1] / "golden/audit/demo.json").read_text())[0])


def row(job: str = "Pod/x", findings: tuple[str, ...] = (), **kw: object) -> JobSummary:
    values: dict = {
        "gpus": 1.0,
        "gpu_hours": 2.0,
        "gpu_util": 1.0,
        "gr_engine_active": None,
        "sm_active": 0.03,
        "tensor_active": None,
        "dram_active": 0.0,
        "mfu_estimate": None,
        "coverage": 1.0,
        "waste_gpu_hours": 1.94,
        "verdict": Verdict.LOW_SM_EFFICIENCY,
    }
    values.update(kw)
    means = {k: values.pop(k) for k in list(values) if hasattr(BASE.means, k)}
    return replace(
        BASE,
        key=JobKey.of("c", "ns", job),
        team="t",
        findings=tuple(Finding(c, "") for c in findings),
        means=replace(BASE.means, **means),
        **values,
    )


def test_table_columns_and_missing_values():
    out = format_table(
        [
            row(),
            row(
                job="Pod/y",
                sm_active=None,
                waste_gpu_hours=None,
                verdict=Verdict.INSUFFICIENT_DATA,
                findings=("fp32_pipe_missing",),
            ),
        ]
    )
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["NAMESPACE", "JOB", "TEAM"] and "VERDICT" in lines[0]
    assert "low_sm_efficiency" in lines[1] and "3.0%" in lines[1] and "100%" in lines[1]
    assert " - " in lines[2] and "no FP32 series" in lines[2]  # missing is '-', never 0
    assert lines[-1].startswith("2 jobs, 4.00 GPU-hours")


def test_mig_util_from_gr_engine_is_marked():
    out = format_table([row(gpu_util=None, gr_engine_active=0.99, gpus=3 / 7)])
    assert "99%*" in out and "0.43" in out and "GR_ENGINE_ACTIVE" in out


def test_empty():
    assert format_table([]) == "no GPU jobs found in the window\n"
    assert notes(["collective_wait_straggler", "x"]) == "straggler"


def test_mfu_is_said_relative_to_the_precision_peak_and_copies_are_noted():
    out = format_table([row(mfu_estimate=0.4, findings=("copy_only",))])
    assert "dense tensor peak of the precision in use" in out.splitlines()[-1]
    assert "copies only" in out
    assert "precision" not in format_table([row()])  # no estimate, no note
