"""Settings for an operator that a test starts in its own process: one cluster, its own SQLite
store, no Lease, no weekly report, an ephemeral HTTP port, only the policies the test gives.

Each operator test used to spell these eight keys out; what a test changes is what it is about,
so it passes only that (``overrides``, merged key by key into these).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from auditor.settings import Settings, load_settings

#: a warn-mode policy that notifies on low SM efficiency (the spinning-thread trace's verdict)
NOTIFY_LOW_SM = """\
apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: tell-low-sm}
spec:
  mode: warn
  verdicts: [low_sm_efficiency]
  escalation:
    - actions: [notify]
"""


def _merged(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


def operator_settings(tmp_path: Path, *, policy: str | None = None, **overrides: Any) -> Settings:
    """Settings for ``Operator(...)`` in a test; ``policy`` is one policy file's text."""
    policies: dict[str, Any] = {"builtin": False}
    if policy is not None:
        directory = tmp_path / "policies"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "policy.yaml").write_text(policy)
        policies["dir"] = str(directory)
    base = {
        "cluster": "t",
        "store": {"url": f"sqlite:///{tmp_path}/s.db"},
        "leader_election": {"enabled": False},
        "policies": policies,
        "reports": {"weekly_schedule": ""},
        "http": {"host": "127.0.0.1", "port": 0},
    }
    return load_settings(None, environ={}, overrides=_merged(base, overrides))
