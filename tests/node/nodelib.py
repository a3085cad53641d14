"""Helpers of the node tests (imported by name, like tests/chart/chartlib.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCHEDULER = "gpu-auditor-testbed"


def postrender_args(testbed) -> list[str]:
    port = int(testbed.apiserver_url.rsplit(":", 1)[1])
    script = Path(__file__).with_name("postrender.py")
    opts = json.dumps({"apiserver_port": port, "scheduler": SCHEDULER})
    return ["--post-renderer", sys.executable, "--post-renderer-args", str(script), "--post-renderer-args", opts]
