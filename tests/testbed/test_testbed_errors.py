"""A component that fails to start gives an error naming it, the cause and its log (no server needed)."""

from __future__ import annotations

import pytest

from auditor.testbed import process
from auditor.testbed.errors import TestbedError
from auditor.testbed.launch import launch
from auditor.testbed.state import State


def test_dying_component_names_itself_the_cause_and_the_log(tmp_path):
    state = State(tmp_path)
    with pytest.raises(TestbedError) as err:
        launch(
            state,
            "fake-server",
            lambda p: ["sh", "-c", f"echo boom on {p['port']} >&2; exit 3"],
            lambda p: lambda: False,
            ports=("port",),
            marker="boom",
            timeout=10,
        )
    msg = str(err.value)
    assert err.value.component == "fake-server"
    assert "exit code 3" in msg
    assert str(tmp_path / "logs" / "fake-server.log") in msg
    assert "boom on" in msg  # the log's tail is in the message


def test_not_ready_component_times_out_and_is_stopped(tmp_path):
    state = State(tmp_path)
    with pytest.raises(TestbedError, match="not ready after 1 s") as err:
        launch(state, "sleepy", lambda p: ["sleep", "300"], lambda p: lambda: False, marker="300", timeout=1)
    assert not process.alive(state.procs["sleepy"].pid)
    assert err.value.component == "sleepy"
