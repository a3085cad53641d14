"""``python -m auditor.agent [flags]``: the agent without the rest of the CLI.

``gpu-auditor agent`` loads every subcommand's module to build its parser; this entry point loads
only the agent's, so it runs where the audit's dependencies (sqlmodel, kubernetes, requests…)
are not installed — the validation machine, or a minimal agent image.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from auditor.errors import AuditorError, BadInput


def main(argv: Sequence[str] | None = None) -> int:
    from auditor.cli import agent as cli

    parser = argparse.ArgumentParser(
        prog="python -m auditor.agent", description="gpu-auditor node agent (see docs/agent.md)"
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    cli.add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return cli.run(args)
    except BadInput as exc:
        print(f"gpu-auditor agent: error: {exc}", file=sys.stderr)
        return 2
    except AuditorError as exc:
        print(f"gpu-auditor agent: failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
