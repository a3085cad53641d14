"""The real local test bed: kube-apiserver + etcd (+ controller manager, Kueue), Prometheus, PostgreSQL.

``python -m auditor.testbed up|down|env|status``; ``make testbed-up`` / ``make testbed-down``.
Tests reach it through the fixtures in ``tests/conftest.py``; docs/testbed.md says what it is and
what tests can assume.
"""

from __future__ import annotations

from auditor.testbed.backfill import write_blocks
from auditor.testbed.bed import Testbed, attach, down, health, up
from auditor.testbed.errors import TestbedError

__all__ = ["Testbed", "TestbedError", "attach", "down", "health", "up", "write_blocks"]
