"""What operator/Dockerfile relies on, tested without a Docker engine (none is reachable here).

The image build itself is unverified (docs/install.md says so). Its steps are: build the wheel
from the repository, install it with its dependencies into a clean virtual environment, run
`gpu-auditor` as a non-root user with a read-only root filesystem and only a scratch /tmp
writable (the chart's securityContext and emptyDir). This test does exactly that on the host:
a mount namespace remounts / read-only and `setpriv` drops to `nobody`.

Installing the dependencies into a clean venv takes a minute or two (from the pip cache or PyPI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


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
        probe = subprocess.run(NOBODY + ["env", "-i", real, "-c", "import sys, venv; print(sys.version_info >= (3, 11))"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return real
    pytest.fail("no Python >= 3.11 with the venv module that user nobody can run (e.g. Debian's python3, python3-venv)")


@pytest.fixture(scope="module")
def installed():
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to nobody and to remount / read-only in a mount namespace")
    work = Path(tempfile.mkdtemp(prefix="gpu-auditor-image-", dir="/var/tmp"))
    try:
        work.chmod(0o755)
        wheels = work / "wheels"
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(wheels), str(ROOT)])
        (wheel,) = wheels.glob("gpu_auditor-*.whl")
        venv = work / "venv"
        _run([_python_for_nobody(), "-m", "venv", str(venv)])
        _run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", str(wheel)])
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
    env = ["env", "-i", "PATH=/usr/bin:/bin", f"HOME={scratch}", f"TMPDIR={scratch}",
           f"MPLCONFIGDIR={scratch}/matplotlib", f"XDG_CACHE_HOME={scratch}/.cache", "PYTHONDONTWRITEBYTECODE=1"]
    return subprocess.run(["unshare", "--mount", "sh", "-c", script, "sh", *NOBODY, *env, *args],
                          capture_output=True, text=True, timeout=120)


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
    probe = ("import os, importlib.resources as r, operator, yaml, kubernetes, sqlmodel, psycopg, alembic, apscheduler, matplotlib;"
             "assert os.geteuid() == 65534;"
             "assert operator.__file__ is None or 'site-packages' not in operator.__file__;"
             "yaml.safe_load(r.files('auditor').joinpath('permissions.yaml').read_text());"
             "open(os.path.join(os.environ['TMPDIR'], 'ok'), 'w').write('x');"
             "print('imports-ok', flush=True);"
             "open('/etc/probe', 'w')")
    res = run_locked_down(venv, str(venv / "bin" / "python"), "-c", probe)
    assert "imports-ok" in res.stdout, "imports or scratch writes failed as nobody: " + res.stderr
    assert res.returncode != 0 and "Read-only file system: '/etc/probe'" in res.stderr, res.stderr


def test_dockerfile_matches_the_chart():
    """The Dockerfile's user and entry point are what the chart's Deployment assumes."""
    df = (ROOT / "operator/Dockerfile").read_text()
    assert "USER 10001:10001" in df and 'ENTRYPOINT ["gpu-auditor"]' in df
    assert "python -m pip wheel --no-deps" in df
    assert not (ROOT / "operator/__init__.py").exists()
    assert not list((ROOT / "operator").glob("*.py"))
