"""MFU and the MFU gap where a user looks on the command line (issue 28): the default ``audit``
table (MFU~ and GAP-H within 120 columns, said relative to what), the demo page, ``explain``
(the MFU, what it could be and from where, what the gap costs; ``n/a`` with the no-tensor-cores
advice), and ``make demo``'s founding case."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_table import _long_rows, row

from auditor.cli.demo import run_demo
from auditor.cli.explain import mfu_lines
from auditor.cli.main import main
from auditor.core.model import Verdict
from auditor.render.html import render_html
from auditor.render.table import format_table

FOUNDING = row(
    "PyTorchJob/llm-pretrain",
    gpus=8.0,
    gpu_hours=24.0,
    sm_active=0.95,
    tensor_active=0.17,
    mfu_estimate=0.16,
    mfu_reference=0.4,
    mfu_class="llm-training",
    waste_gpu_hours=1.2,
    recoverable_gpu_hours=14.4,
    verdict=Verdict.LOW_MFU,
)
NO_TENSOR = row(
    "Pod/mlp-fp32", sm_active=0.97, tensor_active=0.0, mfu_estimate=0.00002, verdict=Verdict.NO_TENSOR_CORES
)
CNN = row("Job/resnet", sm_active=0.86, tensor_active=0.13, mfu_estimate=0.12, verdict=Verdict.HEALTHY)


def _header(out: str) -> list[str]:
    return out.splitlines()[0].split()


def test_the_default_table_has_mfu_and_the_gap_within_120_columns() -> None:
    out = format_table([FOUNDING, NO_TENSOR, CNN, *_long_rows()])
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 120, out
    header = _header(out)
    assert header[header.index("SM") + 1 : header.index("VERDICT")] == ["MFU~", "WASTE-H", "GAP-H"]
    founding = next(line for line in lines if "llm-pretrain" in line)
    assert " 16% " in founding and " 14.40 " in founding and "low_mfu" in founding
    assert " n/a " in next(line for line in lines if "mlp-fp32" in line)
    # a job without a reference is never charged: '-', not 0
    assert next(line for line in lines if "Job/resnet" in line).split()[-2] == "-"
    # said relative to what, and what the gap is
    assert "14.40 GPU-hours recoverable at the reference MFU of their class or lineage (1 of 7 jobs" in out
    assert "MFU~ = share of the dense tensor peak of the precision in use" in out and "n/a = no tensor work" in out
    assert "GAP-H = GPU-hours not needed at the reference MFU" in out


def test_without_references_no_gap_is_said() -> None:
    out = format_table([CNN])
    assert "recoverable" not in out and "GAP-H =" not in out and "n/a =" not in out
    assert "MFU~ = share of the dense tensor peak" in out


def test_the_wide_table_names_the_reference_and_its_class() -> None:
    out = format_table([FOUNDING, CNN], wide=True)
    founding = next(line for line in out.splitlines() if "llm-pretrain" in line)
    assert " 16% " in founding and " 40% " in founding and " llm-training " in founding


def test_the_demo_page_shows_the_mfu_gap() -> None:
    page = render_html(
        [FOUNDING, NO_TENSOR, CNN],
        title="t",
        generated_at=__import__("datetime").datetime(2026, 12, 1),
        window_start="a",
        window_end="b",
        with_charts=False,
    )
    assert "recoverable GPU-h" in page and "14.40" in page and "40.0% (llm-training)" in page
    assert "at their reference MFU, these\n1 job would have needed 14.4 fewer\nGPU-hours" in page
    assert "<td>n/a</td>" in page


def test_explain_says_the_mfu_what_it_could_be_and_what_the_gap_costs() -> None:
    assert mfu_lines(FOUNDING) == [
        "MFU: 16.0% (estimated) of the dense tensor peak of the precision in use (bf16, FP8 or TF32)",
        "  could be: 40.0%, the reference of its workload class llm-training",
        "  the gap costs 14.40 of its 24.00 GPU-hours (60 %): at the reference MFU the same work would not "
        "have needed them",
    ]
    lineage = replace(FOUNDING, mfu_class="lineage-best", mfu_reference=0.45)
    assert mfu_lines(lineage)[1] == "  could be: 45.0%, its lineage's best earlier run"
    (na,) = mfu_lines(NO_TENSOR)
    assert na.startswith("MFU: n/a: the tensor cores did no work (tensor activity 0.0%)")
    assert "bf16 mixed precision (torch.autocast), or TF32" in na
    assert "no reference MFU applies" in mfu_lines(CNN)[1] and len(mfu_lines(CNN)) == 2
    assert mfu_lines(replace(CNN, mfu_estimate=None)) == ["MFU: - (no tensor-pipe series: nothing to estimate it from)"]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    run_demo(out, html=False)
    return out


def test_the_demo_shows_the_founding_case_with_its_gap(demo_dir: Path, capsys) -> None:
    """``make demo``: the LLM jobs carry the llm-training class label; the unfused-attention
    pretraining job reads its MFU against the class's reference and is charged its gap, the CNN
    and the recommender (classes without a reference) are not."""
    db = f"sqlite:///{demo_dir / 'demo.sqlite'}"
    assert main(["explain", "llm/PyTorchJob/llm-pretrain-naive-attn", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "could be: 40.0%, the reference of its workload class llm-training" in out
    assert "the gap costs 2.4" in out
    assert main(["explain", "vision/PyTorchJob/resnet50-train", "--db", db]) == 0
    assert "no MFU gap is charged" in capsys.readouterr().out
    assert main(["explain", "vision/Pod/mlp-baseline", "--db", db]) == 0
    assert "MFU: n/a: the tensor cores did no work" in capsys.readouterr().out
