"""Building the product's container image (and the node's pause image) here, without a registry.

The one recipe is ``operator/Dockerfile``. Its base is normally the public ``python`` image; no
registry but the package registries is reachable here, so the base is a Debian bookworm rootfs
made by ``mmdebstrap`` from Debian's packages and imported into buildah's own storage. buildah
(daemonless, root, overlay storage) builds the Dockerfile on it; the result is written as a
docker-archive under ``<cache>/images/`` named by a hash of everything that goes into it, so an
unchanged tree never rebuilds. The node imports these archives into containerd.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from auditor.testbed import config
from auditor.testbed.binaries import file_lock
from auditor.testbed.errors import TestbedError

REPOSITORY = "localhost/gpu-auditor"
PAUSE_REPOSITORY = "localhost/pause"
DOCKERFILE = config.REPO_ROOT / "operator" / "Dockerfile"
#: The base rootfs: what the Dockerfile needs of its base (python3 with venv, useradd) plus the CA
#: bundle. Changing this list makes a new base (its hash is in the tag).
BASE_SUITE = "bookworm"
BASE_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "passwd", "ca-certificates")
#: The host's CA bundle, handed to pip in the build (a TLS-intercepting proxy signs PyPI here).
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
PAUSE_SOURCE = config.PACKAGE_DIR / "pause" / "pause.go"
#: product archives kept in the cache (the newest ones)
KEEP_ARCHIVES = 3


@dataclass(frozen=True)
class Image:
    """A built image: ``repository:tag`` and the docker-archive that containerd imports."""

    repository: str
    tag: str
    archive: Path
    build_seconds: float
    size_bytes: int

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


def images_dir() -> Path:
    return config.cache_dir() / "images"


def buildah(*args: str, timeout: float = 1800) -> str:
    """buildah with its storage in the cache (never the host's /var/lib/containers)."""
    if shutil.which("buildah") is None:
        raise TestbedError("image", "buildah not found (Debian package buildah; `make system-deps` installs it)")
    proc = subprocess.run(_buildah_argv(*args), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise TestbedError("image", f"`buildah {' '.join(args)}` exited {proc.returncode}: {proc.stderr[-3000:]}")
    return proc.stdout


def _exists(ref: str) -> bool:
    try:
        buildah("inspect", "--type", "image", ref)
    except TestbedError:
        return False
    return True


def base_image() -> str:
    """The Debian base, made once per package list: mmdebstrap → a scratch container → commit."""
    digest = hashlib.sha256(json.dumps([BASE_SUITE, BASE_MIRROR, BASE_PACKAGES]).encode()).hexdigest()[:12]
    ref = f"localhost/gpu-auditor-base:{BASE_SUITE}-{digest}"
    if _exists(ref):
        return ref
    if shutil.which("mmdebstrap") is None:
        raise TestbedError("image", "mmdebstrap not found (Debian package mmdebstrap; `make system-deps` installs it)")
    with tempfile.TemporaryDirectory(prefix="gpu-auditor-base-", dir="/var/tmp") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        argv = [
            "mmdebstrap",
            "--variant=minbase",
            "--quiet",
            f"--include={','.join(BASE_PACKAGES)}",
            "--aptopt=Acquire::Languages none",
            *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale", "info")),
            BASE_SUITE,
            str(tar),
            BASE_MIRROR,
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise TestbedError("image", f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr[-3000:]}")
        _commit_rootfs(tar, ref, ["--cmd", "python3"])
    return ref


def _commit_rootfs(tar: Path, ref: str, config_args: list[str]) -> None:
    container = buildah("from", "scratch").strip()
    try:
        mount = buildah("mount", container).strip()
        subprocess.run(["tar", "-C", mount, "-xf", str(tar)], check=True, timeout=600)
        buildah(
            "config",
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            *config_args,
            container,
        )
        buildah("commit", "--quiet", container, ref)
    finally:
        subprocess.run(_buildah_argv("rm", container), capture_output=True)


def _buildah_argv(*args: str) -> list[str]:
    store = config.cache_dir() / "buildah"
    return [
        "buildah",
        "--root",
        str(store / "root"),
        "--runroot",
        str(store / "run"),
        "--storage-driver",
        "overlay",
        *args,
    ]


def context_files() -> list[Path]:
    """What the Dockerfile COPYs (its .dockerignore's list): relative paths, sorted."""
    root = config.REPO_ROOT
    files = [Path("pyproject.toml"), Path("README.md")]
    for top, skip_py in (("auditor", False), ("policies", True)):
        for p in sorted((root / top).rglob("*")):
            rel = p.relative_to(root)
            if not p.is_file() or "__pycache__" in rel.parts or p.suffix == ".pyc":
                continue
            if rel.parts[:2] == ("auditor", "testbed") or (skip_py and p.suffix == ".py"):
                continue
            files.append(rel)
    return sorted(files)


def content_hash(base: str) -> str:
    """A hash of the base, the Dockerfile and every file of the build context."""
    h = hashlib.sha256()
    h.update(base.encode() + b"\0" + DOCKERFILE.read_bytes())
    for rel in context_files():
        h.update(b"\0" + str(rel).encode() + b"\0" + (config.REPO_ROOT / rel).read_bytes())
    return h.hexdigest()[:16]


def _recorded(archive: Path, repository: str, tag: str) -> Image | None:
    meta = archive.with_suffix(".json")
    if not (archive.is_file() and meta.is_file()):
        return None
    m = json.loads(meta.read_text())
    return Image(repository, tag, archive, m["build_seconds"], m["size_bytes"])


def _push(ref: str, archive: Path, seconds: float) -> None:
    tmp = archive.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    buildah("push", "--quiet", ref, f"docker-archive:{tmp}:{ref}")
    size = int(json.loads(buildah("inspect", "--type", "image", ref)).get("Size") or 0) or tmp.stat().st_size
    archive.with_suffix(".json").write_text(json.dumps({"build_seconds": round(seconds, 1), "size_bytes": size}))
    tmp.rename(archive)


def build_product() -> Image:
    """The operator + node-agent image for the current tree (cached by content hash)."""
    with file_lock(config.cache_dir() / "image.lock"):
        base = base_image()
        tag = content_hash(base)
        archive = images_dir() / f"gpu-auditor-{tag}.tar"
        done = _recorded(archive, REPOSITORY, tag)
        if done:
            return done
        images_dir().mkdir(parents=True, exist_ok=True)
        _say(f"building {REPOSITORY}:{tag} from {DOCKERFILE.relative_to(config.REPO_ROOT)} on {base}")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="gpu-auditor-ctx-", dir="/var/tmp") as tmp:
            ctx = Path(tmp)
            for rel in context_files():
                (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(config.REPO_ROOT / rel, ctx / rel)
            args = ["bud", "--quiet", "--network", "host", "--layers=false", "--build-arg", f"PYTHON_IMAGE={base}"]
            if HOST_CA.is_file():
                args += ["--volume", f"{HOST_CA}:/run/host-ca.crt:ro", "--build-arg", "PIP_CERT=/run/host-ca.crt"]
            buildah(*args, "-f", str(DOCKERFILE), "-t", f"{REPOSITORY}:{tag}", str(ctx))
        _push(f"{REPOSITORY}:{tag}", archive, time.monotonic() - t0)
        buildah("rmi", f"{REPOSITORY}:{tag}")
        image = _recorded(archive, REPOSITORY, tag)
        assert image is not None
        _say(f"built {image.ref}: {image.size_bytes / 1e6:.0f} MB in {image.build_seconds:.0f} s")
        _prune(keep=KEEP_ARCHIVES)
        return image


def _prune(keep: int) -> None:
    """Only the newest ``keep`` product archives stay (each is ~600 MB; every change of the tree
    makes a new one). A running node has imported its image into containerd already."""
    archives = sorted(images_dir().glob("gpu-auditor-*.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in archives[keep:]:
        old.unlink(missing_ok=True)
        old.with_suffix(".json").unlink(missing_ok=True)


def build_pause() -> Image:
    """The sandbox image: one static Go binary (``pause/pause.go``) in an otherwise empty image."""
    tag = hashlib.sha256(PAUSE_SOURCE.read_bytes()).hexdigest()[:12]
    with file_lock(config.cache_dir() / "image.lock"):
        archive = images_dir() / f"pause-{tag}.tar"
        done = _recorded(archive, PAUSE_REPOSITORY, tag)
        if done:
            return done
        images_dir().mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="gpu-auditor-pause-") as tmp:
            root = Path(tmp) / "root"
            root.mkdir()
            env = {"CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "", "GO111MODULE": "off"}
            proc = subprocess.run(
                ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(root / "pause"), str(PAUSE_SOURCE)],
                capture_output=True,
                text=True,
                env={**os.environ, **env},
                timeout=600,
            )
            if proc.returncode != 0:
                raise TestbedError("image", f"go build {PAUSE_SOURCE} exited {proc.returncode}: {proc.stderr[-2000:]}")
            tar = Path(tmp) / "rootfs.tar"
            subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True)
            ref = f"{PAUSE_REPOSITORY}:{tag}"
            _commit_rootfs(tar, ref, ["--entrypoint", '["/pause"]', "--user", "65535:65535"])
        _push(ref, archive, time.monotonic() - t0)
        buildah("rmi", ref)
        image = _recorded(archive, PAUSE_REPOSITORY, tag)
        assert image is not None
        return image


def _say(msg: str) -> None:
    print(f"testbed: {msg}", file=sys.stderr, flush=True)
