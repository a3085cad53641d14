"""The image cache keeps the newest product archives only (auditor/testbed/image.py): each is
~600 MB and every change of the tree makes a new one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from auditor.testbed import image


def test_only_the_newest_archives_stay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_AUDITOR_CACHE", str(tmp_path))
    d = image.images_dir()
    d.mkdir(parents=True)
    for age, tag in enumerate(["e", "d", "c", "b", "a"]):  # "e" newest
        for suffix in (".tar", ".json"):
            f = d / f"gpu-auditor-{tag}{suffix}"
            f.write_text(tag)
            os.utime(f, (1_000_000 - age, 1_000_000 - age))
    (d / "pause-x.tar").write_text("pause")
    image._prune(keep=3)
    assert sorted(p.name for p in d.iterdir()) == [
        "gpu-auditor-c.json",
        "gpu-auditor-c.tar",
        "gpu-auditor-d.json",
        "gpu-auditor-d.tar",
        "gpu-auditor-e.json",
        "gpu-auditor-e.tar",
        "pause-x.tar",
    ]
