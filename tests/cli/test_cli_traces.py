import pytest

from auditor.cli.main import main
from auditor.cli.traces import parse_job_spec
from auditor.errors import BadInput


def test_to_openmetrics_file(tmp_path, capsys):
    out = tmp_path / "x.om"
    rc = main(
        [
            "traces",
            "to-openmetrics",
            "h200-microbench",
            "--job",
            "llm/ft-0=one_sm_spin,idle",
            "--all-phases",
            "bench",
            "--drop",
            "fp32_active",
            "--duration",
            "2m",
            "--interval",
            "30s",
            "--end",
            "2026-11-30T12:00:00Z",
            "--convention",
            "exported_pod",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    text = out.read_text()
    assert text.endswith("# EOF\n") and 'exported_pod="ft-0"' in text and 'exported_pod="naive-softmax"' in text
    assert "FP32" not in text
    assert text.count('DCGM_FI_DEV_GPU_UTIL{gpu="1"') == 4  # ft-0's second GPU, 2 min at 30 s
    assert " 1796040000.000" not in text and " 1796039970.000" in text  # last sample one interval before --end


def test_phases(capsys):
    assert main(["traces", "phases", "h200-microbench"]) == 0
    assert "one_sm_spin" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["traces", "to-openmetrics", "h200-microbench"],
        ["traces", "to-openmetrics", "h200-microbench", "--job", "x/y=nope"],
        ["traces", "to-openmetrics", "h200-microbench", "--job", "x/y=idle", "--drop", "bogus"],
        ["traces", "to-openmetrics", "h200-microbench", "--job", "x/y=idle", "--end", "2026-01-01T00:00:00"],
    ],
)
def test_bad_usage_exits_2(argv, capsys):
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_parse_job_spec():
    pod, phases = parse_job_spec("ns/p=a", 3)
    assert (pod.namespace, pod.pod, phases) == ("ns", "p", ("a", "a", "a"))
    with pytest.raises(BadInput):
        parse_job_spec("nsp=a", 1)
