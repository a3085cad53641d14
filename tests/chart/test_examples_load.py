"""Every chart example renders a settings file and policies that the operator's own loaders accept.

The worked example (``ci/full-values.yaml``) once rendered settings that ``gpu-auditor run``
refused (``unknown key thresholds``) and a policy that ``policy validate`` refused, while the
render test only looked for the key. Here each example (the defaults and every ``ci/*.yaml``) is
rendered by the test bed's real helm, and its ConfigMaps are loaded exactly as the pod would:
the settings file through :func:`auditor.settings.load_settings` with the Deployment's own
environment, the policies ConfigMap as the mounted directory next to the shipped policies
(:func:`auditor.operator_loop.policies.policy_files`) and through ``gpu-auditor policy validate``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from chartlib import CHART, Chart, find

from auditor.cli.main import main
from auditor.core.mfu import DEFAULT_CLASSES
from auditor.core.thresholds import Thresholds
from auditor.operator_loop.policies import policy_files
from auditor.policy.loader import load_files
from auditor.settings import load_settings

pytestmark = pytest.mark.testbed

#: the defaults (no values file) and every example values file the chart ships
EXAMPLES: list[Path | None] = [None, *sorted((CHART / "ci").glob("*.yaml"))]
DATABASE_URL = "postgresql://gpu-auditor:secret@db.example:5432/gpu_auditor"


def _id(example: Path | None) -> str:
    return "defaults" if example is None else example.name


def pod_environment(deployment: dict) -> dict[str, str]:
    """The operator container's variables as the kubelet would set them: plain values as
    rendered, Secret references as stand-in values (the store's a valid URL), field refs as names."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif "secretKeyRef" in e.get("valueFrom", {}):
            env[e["name"]] = DATABASE_URL if e["name"] == "GPU_AUDITOR_DATABASE_URL" else f"secret:{e['name']}"
        else:
            env[e["name"]] = f"field:{e['name']}"
    return env


def _env_keys(node: object, path: str = "") -> list[tuple[str, str]]:
    """Every ``*_env`` key of the settings (path, variable it names)."""
    out: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{path}.{k}" if path else str(k)
            if str(k).endswith("_env") and isinstance(v, str):
                out.append((key, v))
            else:
                out += _env_keys(v, key)
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=_id)
def test_example_settings_and_policies_load(chart: Chart, example: Path | None, tmp_path, capsys) -> None:
    values = [example] if example is not None else []
    objs = chart.render(values=values)
    given = yaml.safe_load(example.read_text()) if example is not None else {}

    # --- the settings file, with the pod's environment
    (settings_cm,) = find(objs, "ConfigMap", "ga-gpu-auditor-settings")
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text(settings_cm["data"]["settings.yaml"])
    (deployment,) = find(objs, "Deployment")
    env = pod_environment(deployment)
    settings = load_settings(settings_file, environ=env)
    assert settings.thresholds == Thresholds.from_mapping(given.get("thresholds"))
    # every variable the settings name is one the Deployment sets
    raw = yaml.safe_load(settings_file.read_text())
    missing = {key: var for key, var in _env_keys(raw) if var not in env}
    assert not missing, missing
    assert settings.database_url(env)

    # --- the policies ConfigMap, mounted at policies.dir next to the shipped policies
    (policies_cm,) = find(objs, "ConfigMap", "ga-gpu-auditor-policies")
    mounted = tmp_path / "policies"
    mounted.mkdir()
    for name, text in (policies_cm.get("data") or {}).items():
        (mounted / name).write_text(text)
    assert settings.policies.dir == "/etc/gpu-auditor/policies"
    as_mounted = settings.model_copy(update={"policies": settings.policies.model_copy(update={"dir": str(mounted)})})
    loaded = {p.name for p in load_files(policy_files(as_mounted))}
    expected_files = set((given.get("policies") or {}).get("files") or {})
    assert {f.name for f in mounted.iterdir()} == expected_files
    if expected_files:
        assert main(["policy", "validate", str(mounted)]) == 0, capsys.readouterr().err
        assert loaded >= {yaml.safe_load(t)["metadata"]["name"] for t in policies_cm["data"].values()}
    if settings.policies.builtin:
        assert loaded >= {"high-util-low-sm", "idle-gpus"}


def test_full_example_sets_thresholds(chart: Chart, tmp_path) -> None:
    """The worked example's thresholds reach the operator's settings, merged with the defaults."""
    objs = chart.render(values=[CHART / "ci" / "full-values.yaml"])
    (cm,) = find(objs, "ConfigMap", "ga-gpu-auditor-settings")
    path = tmp_path / "settings.yaml"
    path.write_text(cm["data"]["settings.yaml"])
    th = load_settings(path, environ={"GPU_AUDITOR_DATABASE_URL": DATABASE_URL}).thresholds
    assert th.low_sm == 0.25 and th.busy_util == Thresholds().busy_util
    assert th.power_floor("NVIDIA RTX 6000 Ada Generation") == 100 and th.power_floor("NVIDIA H200") == 250


def test_full_example_sets_mfu_classes(chart: Chart, tmp_path) -> None:
    """The worked example's MFU classes reach the operator's settings in order (they replace the
    shipped ones); the chart's default renders no `mfu:` and keeps the shipped classes."""
    objs = chart.render(values=[CHART / "ci" / "full-values.yaml"])
    (cm,) = find(objs, "ConfigMap", "ga-gpu-auditor-settings")
    path = tmp_path / "settings.yaml"
    path.write_text(cm["data"]["settings.yaml"])
    mfu = load_settings(path, environ={"GPU_AUDITOR_DATABASE_URL": DATABASE_URL}).mfu
    classes = mfu.workload_classes()
    assert [(c.name, c.reference_mfu, c.namespaces) for c in classes] == [
        ("llm-training", 0.40, ("llm-*",)),
        ("vision", None, ("vision",)),
    ]
    assert mfu.lineage_best is True

    (default_cm,) = find(chart.render(), "ConfigMap", "ga-gpu-auditor-settings")
    assert "mfu" not in yaml.safe_load(default_cm["data"]["settings.yaml"])
    default_path = tmp_path / "default.yaml"
    default_path.write_text(default_cm["data"]["settings.yaml"])
    assert load_settings(default_path, environ={}).mfu.workload_classes() == DEFAULT_CLASSES


def test_bad_thresholds_render_but_the_operator_refuses_them_naming_the_key(chart: Chart, tmp_path) -> None:
    """The chart passes thresholds through (the operator owns their rules); the settings loader
    then refuses a percent for a ratio with the key and a hint, before anything runs."""
    objs = chart.render(sets=["thresholds.low_sm=50"])
    (cm,) = find(objs, "ConfigMap", "ga-gpu-auditor-settings")
    path = tmp_path / "settings.yaml"
    path.write_text(cm["data"]["settings.yaml"])
    from auditor.errors import BadInput

    with pytest.raises(BadInput, match=r"thresholds\.low_sm: 50 is out of range .*did you mean 0\.5\?"):
        load_settings(path, environ={})
