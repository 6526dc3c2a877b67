"""`autotune` command line: parse, build, run, print. The only place that prints errors and picks
exit codes (2 for a problem the user can fix, 130 for Ctrl-C). One module per subcommand group:
`search`, `catalog` (models, spaces, validate) and `results` (report, export)."""

from __future__ import annotations

import argparse

import optuna
from rich.markup import escape

from autotune import __version__
from autotune.cli import catalog, results, search
from autotune.cli._console import errors
from autotune.errors import AutotuneError
from autotune.runner import Launcher


def main(argv: list[str] | None = None, *, launcher: Launcher | None = None) -> int:
    """`launcher` starts the search's workers (default: the fork server); tests inject one."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own lines say what happens
    parser = _parser()
    args = parser.parse_args(argv)
    args.launcher = launcher
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except AutotuneError as exc:
        # The message quotes user strings (model names, paths): never read them as markup.
        errors.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        errors.print("interrupted")
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotune",
        description="Find the fastest way to train a Hugging Face Transformers model here.",
    )
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    search.add_parser(commands)
    results.add_parsers(commands)
    catalog.add_parsers(commands)
    return parser
