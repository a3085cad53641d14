"""Every command of ``gpu-auditor --help``, as an admin types it (issue 30): with ``--help``,
with ``-o`` each of its formats on the demo store, piped into ``head -1`` through a real pipe,
and against a busy port, a missing store and an unreachable server. Each ends with the exit
code docs/cli.md promises and, on an error, one line on stderr; never a traceback.

The commands are read from the parser itself, so a command or format added later is run too;
``INVOCATIONS`` says how each one is called on the demo store (a new command without an entry
fails ``test_every_command_has_an_invocation``). Subprocesses, so marked slow.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from auditor.cli.main import build_parser

pytestmark = pytest.mark.slow

EXE = [sys.executable, "-m", "auditor.cli.main"]
DEMO_JOB = "llm/PyTorchJob/llm-finetune"

#: how each leaf command runs on the demo store ({db}, {tmp}); None: it needs a server (audit,
#: doctor and run read Prometheus, agent serves a node), covered by the error cases below
INVOCATIONS: dict[str, list[str] | None] = {
    "demo": None,  # the fixture runs it
    "audit": None,
    "explain": [DEMO_JOB, "--db", "{db}"],
    "doctor": None,
    "run": None,
    "report": ["--week", "this", "--db", "{db}", "--out", "{tmp}/report"],
    "policy validate": None,  # a file argument, no output formats
    "policy simulate": ["--db", "{db}", "--since", "30d"],
    "ack": ["llm/llm-finetune", "--db", "{db}", "--cluster", "demo", "--until", "1h", "--reason", "harness"],
    "actions": ["--db", "{db}"],
    "status": ["--db", "{db}"],
    "console": None,  # serves until stopped: the busy-port case
    "store prune": ["--db", "{db}", "--cluster", "demo", "--dry-run"],
    "agent": None,
    "traces phases": None,
    "traces to-openmetrics": None,
    "version": [],
}


def leaves(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every runnable command (``policy simulate``, not ``policy``) with its parser."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(prefix), parser
        return
    for name, sub in subs[0].choices.items():
        yield from leaves(sub, (*prefix, name))


def output_formats(parser: argparse.ArgumentParser) -> tuple[str, ...]:
    """The choices of the command's ``-o``, or () where it has none (report's are free text)."""
    for a in parser._actions:
        if "-o" in a.option_strings:
            return tuple(a.choices or ("html", "csv", "md", "json"))
    return ()


COMMANDS = dict(leaves(build_parser()))


def closed_port() -> int:
    """A local port nothing listens on (bound, then closed): an unreachable server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(args: list[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, *args], capture_output=True, text=True, timeout=timeout)


def piped_to_head(args: list[str]) -> tuple[int, str, str]:
    """``gpu-auditor ARGS | head -1``, a real pipe between two processes: the command's exit
    code, head's line and the command's stderr."""
    cmd = subprocess.Popen([*EXE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.Popen(["head", "-1"], stdin=cmd.stdout, stdout=subprocess.PIPE, text=True)
    assert cmd.stdout is not None and cmd.stderr is not None
    cmd.stdout.close()  # head alone holds the read end: when it exits, the pipe has no reader
    line, _ = head.communicate(timeout=60)
    err = cmd.stderr.read().decode()
    return cmd.wait(timeout=60), line, err


def assert_quiet(code: int, err: str, expected: int = 0) -> None:
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert code == expected, err


def assert_one_line_error(p: subprocess.CompletedProcess[str], code: int) -> None:
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == code, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if not ln.startswith("gpu-auditor: reading store")]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("gpu-auditor: error:" if code == 2 else "gpu-auditor: failed"), p.stderr


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``gpu-auditor demo`` as an admin runs it: its store and what it said on stderr."""
    out = tmp_path_factory.mktemp("demo")
    p = run(["demo", "--out", str(out), "--no-html"], timeout=120)
    assert p.returncode == 0, p.stderr
    return out / "demo.sqlite", p.stderr


@pytest.fixture(scope="module")
def demo(demo_run: tuple[Path, str]) -> Path:
    return demo_run[0]


@pytest.fixture
def db(demo: Path, tmp_path: Path) -> str:
    """A copy of the demo store per test: ``ack`` writes to it."""
    copy = tmp_path / "demo.sqlite"
    shutil.copy(demo, copy)
    return f"sqlite:///{copy}"


def test_every_command_has_an_invocation() -> None:
    assert set(COMMANDS) == set(INVOCATIONS), "say in INVOCATIONS how a new command runs on the demo store"


def test_help_of_every_command_piped_into_head() -> None:
    for name in ["", *COMMANDS]:
        code, line, err = piped_to_head([*name.split(), "--help"])
        assert_quiet(code, err)
        assert line.startswith("usage: gpu-auditor"), (name, line)


@pytest.mark.parametrize("name", [n for n, inv in INVOCATIONS.items() if inv is not None and n in COMMANDS])
def test_every_output_format_piped_into_head(name: str, db: str, tmp_path: Path) -> None:
    """Each format of the command's ``-o`` (its only output when it has none), read by ``head -1``:
    exit 0 and nothing on stderr but the store line, whether or not head left before the end."""
    invocation = [a.format(db=db, tmp=tmp_path) for a in INVOCATIONS[name] or []]
    formats = output_formats(COMMANDS[name]) or (None,)
    for fmt in formats:
        args = [*name.split(), *invocation, *(["-o", fmt] if fmt else [])]
        code, line, err = piped_to_head(args)
        assert_quiet(code, err)
        assert line.strip(), (args, err)


@pytest.mark.parametrize("name", ["status", "policy simulate", "explain", "actions"])
def test_a_reader_gone_before_the_first_line(name: str, db: str) -> None:
    """The pipe closed before the command writes anything (``| head -0``), so the broken pipe
    happens every time rather than when head wins the race: still exit 0, silent."""
    invocation = [a.format(db=db, tmp="") for a in INVOCATIONS[name] or []]
    cmd = subprocess.Popen([*EXE, *name.split(), *invocation], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert cmd.stdout is not None and cmd.stderr is not None
    cmd.stdout.close()
    err = cmd.stderr.read().decode()
    assert_quiet(cmd.wait(timeout=60), err)


def test_report_format_is_an_alias_of_output(db: str, tmp_path: Path) -> None:
    for flag in ("-o", "--output", "--format"):
        out = tmp_path / flag.strip("-")
        p = run(["report", "--week", "this", "--db", db, "--out", str(out), flag, "md"])
        assert p.returncode == 0, p.stderr
        assert [f.suffix for f in out.iterdir()] == [".md"]


def test_status_help_offers_only_what_it_takes() -> None:
    p = run(["status", "--help"])
    assert "wide" not in p.stdout
    q = run(["status", "-o", "wide"])
    assert q.returncode == 2 and "Traceback" not in q.stderr and "invalid choice: 'wide'" in q.stderr


def test_console_on_a_busy_port_is_one_line_exit_2(db: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = run(["console", "--db", db, "--listen", f"127.0.0.1:{port}"], timeout=30)
    assert_one_line_error(p, 2)
    assert f"--listen 127.0.0.1:{port}" in p.stderr and "in use" in p.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["actions"],
        ["policy", "simulate"],
        ["explain", DEMO_JOB],
        ["report", "--week", "this", "--out", "{tmp}/r"],
        ["console", "--listen", "127.0.0.1:0"],
        ["store", "prune", "--dry-run"],
        ["ack", "llm/llm-finetune", "--cluster", "demo"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_missing_store_is_one_line_exit_1_and_stays_missing(args: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "no-such.sqlite"
    p = run([*(a.format(tmp=tmp_path) for a in args), "--db", f"sqlite:///{missing}"], timeout=30)
    assert_one_line_error(p, 1)
    assert "no such file" in p.stderr
    assert not missing.exists()  # a mistyped path leaves nothing behind


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "--no-kube", "--start", "now-1h", "--prometheus", "http://127.0.0.1:{port}", "--db", "{db}"],
        ["doctor", "--prometheus", "http://127.0.0.1:{port}", "-o", "json"],
        ["status", "--db", "postgresql://auditor:secret-pw@127.0.0.1:{port}/auditor"],
        ["console", "--db", "postgresql://auditor:secret-pw@127.0.0.1:{port}/auditor"],
    ],
    ids=lambda a: a[0],
)
def test_an_unreachable_server_is_exit_1_without_a_traceback(args: list[str], tmp_path: Path) -> None:
    port = closed_port()
    argv = [a.format(port=port, db=f"sqlite:///{tmp_path}/a.sqlite") for a in args]
    p = run([*argv, *(["--prometheus-retries", "0"] if argv[0] in ("audit", "doctor") else [])], timeout=60)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 1, p.stderr
    assert "secret-pw" not in p.stderr
    if argv[0] == "doctor":  # doctor's report is its output: the failed check, on stdout
        assert "unreachable" in p.stdout or "refused" in p.stdout.lower(), p.stdout
    else:
        assert_one_line_error(p, 1)
        assert "127.0.0.1" in p.stderr


def test_the_demo_ends_with_three_commands_that_work_as_printed(demo_run: tuple[Path, str]) -> None:
    """The demo's last lines: explain its worst job, status and the console, each with the
    demo's --db, run from another directory exactly as printed (the console on a free port,
    stopped once it serves)."""
    db, err = demo_run
    printed = [ln.strip() for ln in err.splitlines() if ln.startswith("  gpu-auditor ")]
    assert [ln.split()[1] for ln in printed] == ["explain", "status", "console"], err
    assert all(f"--db sqlite:///{db}" in ln for ln in printed)
    for line in printed:
        argv = shlex.split(line, comments=True)[1:]
        if argv[0] == "console":
            console = subprocess.Popen([*EXE, *argv, "--listen", "127.0.0.1:0"], stderr=subprocess.PIPE, text=True)
            try:
                assert console.stderr is not None
                said = [console.stderr.readline() for _ in range(2)]
                assert any("console (read-only) on http://127.0.0.1:" in s for s in said), said
            finally:
                console.terminate()
                console.wait(timeout=30)
            continue
        p = subprocess.run([*EXE, *argv], capture_output=True, text=True, timeout=60, cwd="/")
        assert p.returncode == 0 and p.stdout.strip() and "Traceback" not in p.stderr, (line, p.stderr)


def test_ack_says_the_cluster_that_holds_the_lineage(db: str) -> None:
    """The demo's store says cluster `demo`; asked for another (`default`), the error names the
    --cluster to pass instead of "known: none". (Without --cluster, ack takes the store's one
    cluster: tests/cli/test_demo.py.)"""
    p = run(["ack", "llm/llm-finetune", "--cluster", "default", "--db", db])
    assert_one_line_error(p, 2)
    assert "pass --cluster demo" in p.stderr


def test_run_without_a_kubeconfig_is_one_line_exit_2(tmp_path: Path) -> None:
    """The operator run by hand on a machine without a cluster: bad settings, said in one line."""
    argv = ["run", "--once", "--dry-run", "--no-leader-election", "--db", f"sqlite:///{tmp_path}/r.sqlite"]
    argv += ["--prometheus", f"http://127.0.0.1:{closed_port()}"]
    p = subprocess.run(
        [*EXE, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": str(tmp_path / "none")},
    )
    assert_one_line_error(p, 2)
    assert "kubeconfig" in p.stderr
