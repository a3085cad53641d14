"""The agent runs where only nvidia-ml-py, prometheus-client and grpcio are installed (the validation H200,
a minimal agent image): none of its code paths may import the audit's dependencies."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = (
    "sqlmodel",
    "sqlalchemy",
    "kubernetes",
    "requests",
    "prometheus_api_client",
    "alembic",
    "apscheduler",
    "psycopg",
    "yaml",
    "jinja2",
    "matplotlib",
    "platformdirs",
    "pandas",
    "numpy",
)

SCRIPT = textwrap.dedent(
    """
    import sys
    BLOCKED = %r

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is not installed here (blocked by the test)")
            return None

    sys.meta_path.insert(0, Block())
    import auditor.agent.__main__ as entry
    import auditor.agent.server, auditor.agent.nvml, auditor.agent.dcgm, auditor.core.source_preference
    from auditor.agent.recorded import RecordedSampler
    from auditor.agent.sampler import Device, open_sampler
    from auditor.agent.server import Agent
    from auditor.agent.podresources import PodResourcesClient, messages
    messages()
    dev = Device(0, "GPU-x", "NVIDIA H200")
    agent = Agent(RecordedSampler([dev], {"GPU-x": [{"DCGM_FI_PROF_SM_ACTIVE": 0.5}]}), node_name="n")
    agent.tick()
    assert b"DCGM_FI_PROF_SM_ACTIVE" in agent.render("s")[0]
    # the real entry point up to the GPU probe (no GPU here: it must fail cleanly, exit 1, not ImportError)
    rc = entry.main(["--listen", "127.0.0.1:0", "--pod-resources-socket", ""])
    assert rc == 1, rc
    print("OK", sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
    """
) % (BLOCKED,)


def test_agent_paths_import_none_of_the_audit_dependencies():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OK []", out.stdout
    assert "no GPU source could start" in out.stderr
