"""The release workflow (.github/workflows/release.yml) publishes what the chart installs.

Read as data, not run (it runs on GitHub on a tag): it must build the image from the same recipe
file the test bed builds (auditor/testbed/image.py's DOCKERFILE), push it under the chart's default
image.repository for amd64 and arm64 with an SBOM, sign it keyless, and push the chart. actionlint
(`make lint`) checks its syntax and the actions' inputs; this test checks its meaning.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from auditor.testbed import image

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def _workflow() -> dict[Any, Any]:
    # PyYAML reads the key `on` as the boolean True (YAML 1.1)
    return yaml.safe_load(WORKFLOW.read_text())


def _steps() -> list[dict[str, Any]]:
    (job,) = _workflow()["jobs"].values()
    return job["steps"]


def _step(uses_prefix: str) -> dict[str, Any]:
    found = [s for s in _steps() if str(s.get("uses", "")).startswith(uses_prefix)]
    assert len(found) == 1, f"expected one step using {uses_prefix}, found {found}"
    return found[0]


def _env(value: str) -> str:
    """A value with the workflow's ${{ env.X }} expressions filled in."""
    env = _workflow()["env"]
    return re.sub(r"\$\{\{\s*env\.(\w+)\s*\}\}", lambda m: str(env[m.group(1)]), value)


def test_runs_on_version_tags_only():
    wf = _workflow()
    assert wf[True] == {"push": {"tags": ["v*"]}}


def test_builds_the_image_from_the_beds_recipe():
    build = _step("docker/build-push-action@")["with"]
    recipe = ROOT / _env(build["file"])
    assert recipe.resolve() == image.DOCKERFILE.resolve(), (recipe, image.DOCKERFILE)
    assert build["context"] == ".", "the recipe COPYs from the repository root"
    assert (ROOT / "operator" / "Dockerfile.dockerignore").is_file()
    # the Makefile's `make image` names the same file
    assert re.search(r"build -f operator/Dockerfile\b", (ROOT / "Makefile").read_text())


def test_pushes_the_charts_default_image_for_both_architectures_with_an_sbom():
    build = _step("docker/build-push-action@")["with"]
    values = yaml.safe_load((ROOT / "charts" / "gpu-auditor" / "values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "charts" / "gpu-auditor" / "Chart.yaml").read_text())
    assert _env(build["tags"]).startswith(values["image"]["repository"] + ":")
    assert "steps.version.outputs.version" in build["tags"]
    assert set(build["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert build["push"] is True and build["sbom"] is True
    # the default tag is the appVersion, which the version step holds equal to the git tag
    version = next(s for s in _steps() if s.get("id") == "version")["run"]
    assert "appVersion" in version and "exit 1" in version
    assert str(chart["appVersion"]) == str(chart["version"])


def test_signs_the_pushed_digest_keyless():
    (job,) = _workflow()["jobs"].values()
    assert job["permissions"]["id-token"] == "write" and job["permissions"]["packages"] == "write"
    _step("sigstore/cosign-installer@")
    signs = [s["run"] for s in _steps() if "cosign sign" in str(s.get("run", ""))]
    assert signs, "no cosign sign step"
    image_sign = next(s for s in _steps() if "cosign sign" in str(s.get("run", "")) and "DIGEST" in s.get("env", {}))
    assert image_sign["env"]["DIGEST"] == "${{ steps.build.outputs.digest }}"
    assert "--key" not in " ".join(signs), "keyless: no key is kept"


def test_pushes_the_chart_as_an_oci_artifact():
    run = "\n".join(str(s.get("run", "")) for s in _steps())
    assert "helm package charts/gpu-auditor" in run
    assert re.search(r"helm push \S+ \"\$CHART_REPOSITORY\"", run)
    assert _workflow()["env"]["CHART_REPOSITORY"].startswith("oci://ghcr.io/")
