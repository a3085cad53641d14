"""What operator/Dockerfile relies on, tested without a Docker engine (none is reachable here).

The image build itself is unverified (docs/install.md says so). Its steps are: build the wheel
from the repository, install it with exactly the extras the Dockerfile names (read from it, so the
two cannot drift) into a clean virtual environment, run
`gpu-auditor` as a non-root user with a read-only root filesystem and only a scratch /tmp
writable (the chart's securityContext and emptyDir). This test does exactly that on the host:
a mount namespace remounts / read-only and `setpriv` drops to `nobody`.

Installing the dependencies into a clean venv takes a minute or two (from the pip cache or PyPI).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
DOCKERFILE = ROOT / "operator" / "Dockerfile"


def dockerfile_extras() -> list[str]:
    """The extras the image installs: the `[...]` of the Dockerfile's one wheel install line."""
    found = re.findall(r"pip install [^\n]*gpu_auditor-\*\.whl\)?\"?\[([A-Za-z0-9_,-]+)\]", DOCKERFILE.read_text())
    assert len(found) == 1, (
        f"expected one `pip install ...gpu_auditor-*.whl[EXTRAS]` line in {DOCKERFILE}, found {found}"
    )
    return found[0].split(",")


def _run(argv: list[str], timeout: float = 900, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}\n{proc.stdout}"
    return proc


def _python_for_nobody() -> str:
    """An interpreter >= 3.11 that user nobody can execute (the venv links to it; a pyenv Python
    under a private /root cannot serve)."""
    for cand in (sys.executable, "/usr/local/bin/python3", "/usr/bin/python3"):
        real = os.path.realpath(cand)
        if not os.path.exists(real):
            continue
        probe = subprocess.run(
            NOBODY + ["env", "-i", real, "-c", "import sys, venv; print(sys.version_info >= (3, 11))"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return real
    pytest.fail("no Python >= 3.11 with the venv module that user nobody can run (e.g. Debian's python3, python3-venv)")


def build_context(work: Path) -> Path:
    """A clean copy of what the Dockerfile's build stage COPYs (a checkout's stale build/ or
    egg-info would otherwise leak into the wheel). auditor/testbed is copied too, although the
    .dockerignore leaves it out: pyproject.toml alone must keep it out of the wheel."""
    src = work / "src"
    build_stage = DOCKERFILE.read_text().split("\nFROM ")[1]
    for line in build_stage.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for name in line.split()[1:-1]:
                if (ROOT / name).is_dir():
                    shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                else:
                    src.mkdir(exist_ok=True)
                    shutil.copy2(ROOT / name, src / name)
    assert (src / "pyproject.toml").is_file() and (src / "auditor" / "testbed").is_dir(), sorted(
        p.name for p in src.iterdir()
    )
    return src


@pytest.fixture(scope="module")
def installed():
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to nobody and to remount / read-only in a mount namespace")
    work = Path(tempfile.mkdtemp(prefix="gpu-auditor-image-", dir="/var/tmp"))
    try:
        work.chmod(0o755)
        wheels = work / "wheels"
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--quiet",
                "--wheel-dir",
                str(wheels),
                str(build_context(work)),
            ]
        )
        (wheel,) = wheels.glob("gpu_auditor-*.whl")
        venv = work / "venv"
        _run([_python_for_nobody(), "-m", "venv", str(venv)])
        extras = ",".join(dockerfile_extras())
        _run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", f"{wheel}[{extras}]"])
        # Compile byte-code now, as the Dockerfile does: at run time nothing may be written.
        _run([str(venv / "bin" / "python"), "-m", "compileall", "-q", str(venv / "lib")])
        _run(["chmod", "-R", "a+rX", str(work)])
        yield wheel, venv
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_locked_down(venv: Path, *args: str) -> subprocess.CompletedProcess:
    """`args` as nobody, / read-only, a fresh tmpfs as the only writable place (like the pod)."""
    scratch = venv.parent / "scratch"
    scratch.mkdir(exist_ok=True)
    script = (
        "set -e; mount --make-rprivate /; mount --bind / /; mount -o remount,bind,ro /; "
        f"mount -t tmpfs -o size=64m,mode=1777 tmpfs {scratch}; "
        f'exec "$@"'
    )
    env = [
        "env",
        "-i",
        "PATH=/usr/bin:/bin",
        f"HOME={scratch}",
        f"TMPDIR={scratch}",
        f"MPLCONFIGDIR={scratch}/matplotlib",
        f"XDG_CACHE_HOME={scratch}/.cache",
        "PYTHONDONTWRITEBYTECODE=1",
    ]
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", *NOBODY, *env, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_wheel_ships_the_permissions_file(installed):
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        shipped = z.read("auditor/permissions.yaml")
    assert shipped == (ROOT / "charts/gpu-auditor/files/permissions.yaml").read_bytes()
    assert not any(n.startswith("operator/") for n in z.namelist()), "the stdlib name `operator` must not be shadowed"


def test_cli_runs_as_nobody_on_a_read_only_root(installed):
    _, venv = installed
    res = run_locked_down(venv, str(venv / "bin" / "gpu-auditor"), "--help")
    assert res.returncode == 0, res.stderr
    assert "usage: gpu-auditor" in res.stdout
    probe = (
        "import os, importlib.resources as r, operator, yaml, kubernetes, sqlmodel, psycopg, alembic, apscheduler, matplotlib;"
        "assert os.geteuid() == 65534;"
        "assert operator.__file__ is None or 'site-packages' not in operator.__file__;"
        "yaml.safe_load(r.files('auditor').joinpath('permissions.yaml').read_text());"
        "open(os.path.join(os.environ['TMPDIR'], 'ok'), 'w').write('x');"
        "print('imports-ok', flush=True);"
        "open('/etc/probe', 'w')"
    )
    res = run_locked_down(venv, str(venv / "bin" / "python"), "-c", probe)
    assert "imports-ok" in res.stdout, "imports or scratch writes failed as nobody: " + res.stderr
    assert res.returncode != 0 and "Read-only file system: '/etc/probe'" in res.stderr, res.stderr


def test_wheel_leaves_out_the_test_bed(installed):
    """The test bed (and its dev-only imports such as `cryptography`) is no part of the product."""
    wheel, venv = installed
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert not [n for n in names if n.startswith("auditor/testbed")], "auditor/testbed must not ship in the wheel"
    assert "auditor/agent/__main__.py" in names
    # the image's environment alone: a PYTHONPATH naming a checkout would import the source tree
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import auditor.testbed"],
        capture_output=True,
        text=True,
        cwd=venv.parent,
        env=clean,
    )
    assert res.returncode != 0 and "No module named 'auditor.testbed'" in res.stderr, res.stderr
    dev_only = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import cryptography"],
        capture_output=True,
        text=True,
        cwd=venv.parent,
        env=clean,
    )
    assert dev_only.returncode != 0, "a dev-only dependency (cryptography) reached the image's environment"


@pytest.mark.parametrize(
    "argv",
    [["gpu-auditor", "agent", "--help"], ["gpu-auditor", "run", "--help"], ["python", "-m", "auditor.agent", "--help"]],
    ids=["agent", "run", "python-m-agent"],
)
def test_every_image_command_starts(installed, argv):
    """The commands the chart's Deployment and DaemonSet start, as the image would run them."""
    _, venv = installed
    res = run_locked_down(venv, str(venv / "bin" / argv[0]), *argv[1:])
    assert res.returncode == 0, res.stderr
    assert "usage:" in res.stdout and "--" in res.stdout


def test_node_agent_has_what_it_needs_at_start(installed):
    """`--help` imports little: the agent needs grpcio + protobuf (kubelet pod-resources) and
    pynvml (NVML) once it starts; building the pod-resources client (no connection yet) and
    importing pynvml prove the `agent` extra is in the image."""
    _, venv = installed
    probe = (
        "from auditor.agent.podresources import PodResourcesClient;"
        "PodResourcesClient('/nonexistent/kubelet.sock').close();"
        "import pynvml;"
        "print('agent-deps-ok')"
    )
    res = run_locked_down(venv, str(venv / "bin" / "python"), "-c", probe)
    assert res.returncode == 0 and "agent-deps-ok" in res.stdout, res.stderr


def test_dockerfile_matches_the_chart():
    """The Dockerfile's user and entry point are what the chart's Deployment assumes."""
    df = (ROOT / "operator/Dockerfile").read_text()
    assert "USER 10001:10001" in df and 'ENTRYPOINT ["gpu-auditor"]' in df
    assert "bin/pip wheel --no-deps" in df
    assert "agent" in dockerfile_extras(), "the chart's node-agent DaemonSet runs `gpu-auditor agent` from this image"
    assert "dev" not in dockerfile_extras()
    assert not (ROOT / "operator/__init__.py").exists()
    assert not list((ROOT / "operator").glob("*.py"))
