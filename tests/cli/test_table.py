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
        "mfu_reference": None,
        "mfu_class": None,
        "recoverable_gpu_hours": None,
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
    assert lines[0].split()[:3] == ["NAMESPACE", "JOB", "GPUS"] and "VERDICT" in lines[0]
    assert "low_sm_efficiency" in lines[1] and "3.0%" in lines[1] and "100%" in lines[1]
    assert " - " in lines[2] and "no FP32 series" in lines[2]  # missing is '-', never 0
    # 1 flagged job; waste counts flagged jobs' idle SMs (docs/figures.md)
    assert lines[-1].startswith("2 jobs (1 flagged), 4.00 GPU-hours, 1.94 waste GPU-hours")


def test_mig_util_from_gr_engine_is_marked():
    mig = row(gpu_util=None, gr_engine_active=0.99, gpus=3 / 7)
    mig = replace(mig, per_gpu=tuple(replace(g, mig_instance="3g.71gb") for g in mig.per_gpu))
    out = format_table([mig])
    assert "99%*" in out and "0.43" in out and "* = MIG, utilization from GR_ENGINE_ACTIVE" in out


def test_empty():
    assert format_table([]) == "no GPU jobs found in the window\n"
    assert notes(["collective_wait_straggler", "x"]) == "straggler"


def test_mfu_is_said_relative_to_the_precision_peak_and_copies_are_noted():
    out = format_table([row(mfu_estimate=0.4, findings=("copy_only",))], wide=True)
    assert "dense tensor peak of the precision in use" in out.splitlines()[-1]
    assert "copies only" in out
    assert "precision" not in format_table([row()], wide=True)  # no estimate, no note


def _long_rows() -> list[JobSummary]:
    """Names as long as Kubernetes allows them to get in practice, and every note at once."""
    return [
        row(
            job=f"PyTorchJob/{'transformer-sdpa-bf16-s1024-batch4-' * 2}{i}",
            gpus=64.0,
            gpu_hours=12345.67,
            waste_gpu_hours=11975.3,
            verdict=Verdict.INSUFFICIENT_DATA,
            findings=("collective_wait_straggler", "idle_gpus_in_job", "gpu_imbalance", "profiling_zero_suspect"),
        )
        for i in range(3)
    ] + [replace(row(), key=JobKey.of("c", "a-namespace-with-a-long-team-name", "Job/x"))]


def test_default_table_fits_120_columns_and_keeps_long_job_names_apart():
    lines = format_table(_long_rows()).splitlines()
    assert max(len(line) for line in lines) <= 120, "\n".join(lines)
    jobs = [line.split()[1] for line in lines[1:4]]
    assert len(set(jobs)) == 3 and all("…" in j and j.startswith("PyTorchJob/") for j in jobs)
    assert jobs[0].endswith("-0") and jobs[2].endswith("-2")  # the distinguishing suffix stays


def test_demo_table_fits_120_columns():
    summaries = [
        JobSummary.from_json(d) for d in json.loads((Path(__file__).parents[1] / "golden/audit/demo.json").read_text())
    ]
    out = format_table(summaries)
    assert max(len(line) for line in out.splitlines()) <= 120
    assert "TEAM" not in out.splitlines()[0] and "TEAM" in format_table(summaries, wide=True).splitlines()[0]


def test_wide_has_every_column_and_cuts_nothing():
    out = format_table(_long_rows(), wide=True)
    header = out.splitlines()[0].split()
    assert header == ["NAMESPACE", "JOB", "TEAM", "GPUS", "GPU-H", "UTIL", "SM", "TENSOR", "DRAM", "MFU~", "REF"] + [
        "CLASS",
        "COV",
        "WASTE-H",
        "GAP-H",
        "VERDICT",
        "NOTES",
    ]
    assert "…" not in out and "straggler, idle GPUs, imbalanced, suspect zeros" in out


def test_hostile_label_text_cannot_forge_a_row_or_repaint_the_terminal():
    evil = replace(row(), key=JobKey.of("c", "ns", "Pod/x\n\x1b[31mfake  row"), team="t\x1b]0;title\x07")
    out = format_table([evil], wide=True)
    assert "\x1b" not in out and "\x07" not in out
    assert len(out.splitlines()) == 3  # header, one row, footer
