"""The operator (``gpu-auditor run``): periodic audit cycles under leader election.

The loop lives here, inside the ``auditor`` package, rather than in ``operator/``: ``operator``
is a standard-library module name (operator/README.md), and the container image installs the
``auditor`` wheel only, so ``operator/`` keeps just the image files.
"""

from auditor.operator_loop.cycle import CycleResult, CycleRunner
from auditor.operator_loop.service import Operator

__all__ = ["CycleResult", "CycleRunner", "Operator"]
