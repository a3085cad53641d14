"""Policies: schema, loading, pure evaluation, escalation and the per-cycle runner.

Entry points: :func:`auditor.policy.loader.load_dir` / :class:`PolicyRegistry` (loading),
:class:`auditor.policy.runner.PolicyRunner` (the operator loop), :func:`auditor.policy.backtest.simulate`.
"""

from auditor.policy.loader import PolicyError, PolicyRegistry, load_dir, load_files, parse_policies
from auditor.policy.schema import Policy

__all__ = ["Policy", "PolicyError", "PolicyRegistry", "load_dir", "load_files", "parse_policies"]
