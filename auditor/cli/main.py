"""``gpu-auditor``: the command-line entry point.

Each subcommand is a module in this package with ``register(subparsers)``, which adds its parser
and sets ``handler`` (a function taking the parsed namespace and returning an exit code). This
module only collects them and maps errors to exit codes: 0 done, 1 failed, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Sequence

from auditor import __version__, redact
from auditor.errors import AuditorError, BadInput

#: subcommand modules, in the order ``--help`` lists them
SUBCOMMANDS = (
    "demo",
    "audit",
    "explain",
    "doctor",
    "run",
    "report",
    "policy",
    "ack",
    "actions",
    "status",
    "console",
    "store",
    "agent",
    "traces",
    "version",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-auditor",
        description="Find GPU jobs whose utilization hides idle SMs, and act on them.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-auditor {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"auditor.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"auditor.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    quiet_libraries(args.verbose)
    from auditor.render.safe_text import terminal_safe

    # every record, ours or a library's (urllib3 logs request paths at -vv): masked, and its
    # message's control characters neutralised
    redact.install(clean=terminal_safe)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        code = int(handler(args) or 0)
        sys.stdout.flush()  # inside the try: a reader gone while the last lines wait is the case below
        return code
    except BrokenPipeError:
        return reader_gone()
    except BadInput as exc:
        print(f"gpu-auditor: error: {error_text(exc)}", file=sys.stderr)
        return 2
    except AuditorError as exc:
        hint = " (retryable)" if exc.retryable else ""
        print(f"gpu-auditor: failed{hint}: {error_text(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gpu-auditor: interrupted", file=sys.stderr)
        return 1


def reader_gone() -> int:
    """Exit 0 quietly when the reader of stdout closed the pipe (``status | head``).

    Python's documented recipe (the ``signal`` module's note on SIGPIPE): point stdout at
    /dev/null so the interpreter's flush at exit cannot raise again, and stop. Exit 0, not 1:
    ``head`` took what it wanted, so nothing failed, and a shell with ``pipefail`` stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a descriptor (a test's capture): nothing to redirect
        pass
    return 0


#: libraries whose own log records are noise to an admin: their INFO lines (alembic's migration
#: context, apscheduler's job runs) only at -vv, and urllib3's and the Kubernetes client's retry
#: warnings not at all below -v (the command's own error says what failed)
NOISY = {"alembic": logging.WARNING, "apscheduler": logging.WARNING, "matplotlib": logging.WARNING}
NOISY_WARNINGS = ("urllib3", "kubernetes")


def quiet_libraries(verbose: int) -> None:
    """Hold the libraries' loggers above the command's level unless ``-vv`` asked for everything."""
    for name, level in NOISY.items():
        logging.getLogger(name).setLevel(logging.NOTSET if verbose >= 2 else level)
    for name in NOISY_WARNINGS:
        logging.getLogger(name).setLevel([logging.ERROR, logging.WARNING, logging.NOTSET][min(verbose, 2)])


def error_text(exc: BaseException) -> str:
    """An error's message as the terminal gets it: credentials masked, and each line's control
    characters neutralised (a message may quote a label; its own line breaks stay)."""
    from auditor.render.safe_text import terminal_safe

    return "\n".join(terminal_safe(line) for line in redact.mask_text(str(exc)).split("\n"))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
