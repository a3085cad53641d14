"""``python -m auditor.testbed up|down|env|status`` (what ``make testbed-up``/``testbed-down`` run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from auditor.errors import AuditorError
from auditor.testbed import bed, config, image


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m auditor.testbed",
        description="Start, stop or inspect the local test bed (real kube-apiserver + etcd, "
        "kube-controller-manager, Kueue, Prometheus, PostgreSQL).",
    )
    parser.add_argument("command", choices=("up", "down", "env", "status", "image"))
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help=f"state directory (default {config.default_state_dir()}; env GPU_AUDITOR_TESTBED_DIR)",
    )
    args = parser.parse_args(argv)
    state_dir = args.dir.resolve() if args.dir else config.default_state_dir()
    try:
        if args.command == "up":
            bed.up(state_dir)
            print(state_dir / "env")
            return 0
        if args.command == "image":
            built = image.build_product()
            print(f"{built.ref} {built.archive} {built.size_bytes} bytes, built in {built.build_seconds:.0f} s")
            return 0
        if args.command == "down":
            bed.down(state_dir)
            return 0
        if args.command == "env":
            tb = bed.attach(state_dir)
            if tb is None:
                print(f"testbed: no healthy test bed in {state_dir} (run `make testbed-up`)", file=sys.stderr)
                return 1
            print((state_dir / "env").read_text(), end="")
            return 0
        ok, lines = bed.status_lines(state_dir)
        print("\n".join(lines))
        return 0 if ok else 1
    except AuditorError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("testbed: interrupted; run `python -m auditor.testbed down` to stop what started", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
