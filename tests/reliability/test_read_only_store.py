"""A store the user may only read: the commands that only read work, the ones that write say
"read-only" once and permanently, and ``report --out`` into a directory it cannot write is one
line (exit 2) instead of a traceback.

The probe: on a read-only SQLite file ``explain``, ``report`` and ``policy simulate`` failed
("migrate the schema failed: unable to open database file") and called it *retryable*. Read
commands now open the store read-only (SQLite ``mode=ro``, PostgreSQL
``default_transaction_read_only``) and only check its schema version.

Read-only is made real: as root (who ignores file modes) a read-only bind mount of the store's
directory, otherwise the file's and directory's write bits removed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import pytest

from auditor.cli.main import main
from auditor.reports.weeks import IsoWeek, zone
from auditor.store import Store

sys.path.insert(0, str(Path(__file__).parent.parent / "reports"))
from reportgen import GenJob, store_jobs

W = IsoWeek(2025, 10)
WS, _ = W.bounds(zone("UTC"))
NOW = WS + timedelta(days=8)


@pytest.fixture
def read_only_store(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A SQLite store with two jobs in week W, in a directory this process cannot write."""
    data = tmp_path / "data"
    data.mkdir()
    db = data / "store.db"
    with Store.open(f"sqlite:///{db}") as s:
        store_jobs(s, [GenJob("a", "j1", WS + timedelta(hours=10), 3, 1, "low_sm")], now=NOW)
    if os.geteuid() == 0:
        view = tmp_path / "ro"
        view.mkdir()
        subprocess.run(["mount", "--bind", str(data), str(view)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        try:
            yield view, f"sqlite:///{view / 'store.db'}"
        finally:
            subprocess.run(["umount", str(view)], check=True)
    else:
        db.chmod(0o444)
        data.chmod(0o555)
        try:
            yield data, f"sqlite:///{db}"
        finally:
            data.chmod(0o755)
    assert not (data / "store.db-wal").exists()  # nothing was written beside it either


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    "argv",
    [
        ["explain", "ns-a/Job/j1"],
        ["policy", "simulate", "--since", "1d", "--output", "json"],
        ["actions"],
    ],
)
def test_commands_that_only_read_read_a_read_only_store(
    read_only_store: tuple[Path, str], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = read_only_store
    before = Path(url.removeprefix("sqlite:///")).read_bytes()
    rc, out, err = cli(capsys, *argv, "--db", url)
    assert rc == 0, err
    assert Path(url.removeprefix("sqlite:///")).read_bytes() == before


def test_report_reads_a_read_only_store(read_only_store: tuple[Path, str], tmp_path: Path, capsys) -> None:
    _, url = read_only_store
    rc, out, err = cli(
        capsys, "report", "--week", str(W), "--format", "json,csv", "--out", str(tmp_path / "out"), "--db", url
    )
    assert rc == 0, err
    assert (tmp_path / "out" / f"report-{W}.json").exists()


def test_a_writing_command_says_read_only_and_not_retryable(read_only_store: tuple[Path, str], capsys) -> None:
    _, url = read_only_store
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, out, err = cli(
        capsys,
        "audit",
        "--prometheus",
        f"http://127.0.0.1:{port}",
        "--no-kube",
        "--start",
        "2026-11-30T09:00:00Z",
        "--end",
        "2026-11-30T10:00:00Z",
        "--db",
        url,
    )
    assert rc == 1
    line = err.strip().splitlines()[-1]
    assert line.startswith("gpu-auditor: failed: store ") and "(retryable)" not in line
    assert "read-only to this user" in line


def test_report_out_into_an_unwritable_directory_is_one_line(read_only_store: tuple[Path, str], capsys) -> None:
    view, url = read_only_store
    rc, out, err = cli(capsys, "report", "--week", str(W), "--out", str(view / "reports"), "--db", url)
    assert rc == 2
    assert err.strip().splitlines() == [
        f"gpu-auditor: error: --out {view / 'reports'}: cannot create the directory: "
        + ("Read-only file system" if os.geteuid() == 0 else "Permission denied")
    ]
