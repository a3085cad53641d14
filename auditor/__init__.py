"""gpu-auditor: find GPU jobs whose "utilization" hides idle streaming multiprocessors.

Layers: ``auditor.core`` is pure (no I/O, ``now`` passed in); ``auditor.sources``,
``auditor.store`` and the other adapters each wrap one outside system; ``auditor.cli``
only wires them together.
"""

__version__ = "0.1.0"
