"""Fixtures of the chart tests: `chart` runs the test bed's real helm and kubectl (chartlib.py)."""

from __future__ import annotations

import pytest
from chartlib import Chart


@pytest.fixture(scope="session")
def chart(testbed) -> Chart:
    return Chart(helm_bin=str(testbed.helm), kubectl_bin=str(testbed.kubectl), kubeconfig=str(testbed.kubeconfig))
