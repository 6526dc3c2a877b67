"""`autotune` command line: parse, build, run, print. The only place that prints errors and picks
exit codes (2 for a problem the user can fix; 75 when the study's database server stayed away;
74 when the study's SQLite file was deleted under the search; 130, 143, 129 for a search
stopped by Ctrl-C, SIGTERM, SIGHUP). One module per subcommand group: `search` (search,
worker), `catalog` (models, spaces, validate), `estimate`, and `results` (report, confirm,
verify, export)."""

from __future__ import annotations

import argparse
import signal
import sys

from rich.markup import escape

from autotune.cli import catalog, estimate, results, search
from autotune.common.errors import (
    OUTPUTS_NOT_WRITTEN_EXIT_CODE,
    AutotuneError,
    ConfigError,
    OutputsNotWritten,
)
from autotune.common.version import __version__
from autotune.execute.base import TrialExecutor
from autotune.outputs.terminal import errors, shown_paths
from autotune.plan.config import (
    ConfirmConfig,
    ExportConfig,
    ReportConfig,
    RunConfig,
    VerifyConfig,
    WorkerConfig,
)
from autotune.store.storage_file import STUDY_FILE_LOST_EXIT_CODE, StudyFileLost
from autotune.store.storage_outage import OUTAGE_EXIT_CODE, StorageUnavailable
from autotune.study.interrupts import SearchInterrupted
from autotune.study.sampling.sampler import quiet_optuna

_SETTINGS = {
    "search": RunConfig,
    "worker": WorkerConfig,
    "report": ReportConfig,
    "export": ExportConfig,
    "confirm": ConfirmConfig,
    "verify": VerifyConfig,
}
"""The key=value settings of each command, for the hint on a `--KEY value` typed instead."""


def main(argv: list[str] | None = None, *, executor: TrialExecutor | None = None) -> int:
    """`executor` runs the search's trials (default: worker processes forked from a fork server of
    this host); tests inject one."""
    quiet_optuna()
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    args.executor = executor
    args.argv = sys.argv[1:] if argv is None else list(argv)  # the study's provenance keeps it
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if unknown:
            _refuse_dashed_settings(sys.argv[1:] if argv is None else argv, args.command)
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        return args.handler(args)
    except StudyFileLost as exc:
        # The study is gone: not a mistake to fix, nor a server to wait for; say what is left.
        written = f"; wrote {shown_paths(exc.paths)}" if exc.paths else ""
        errors.print(
            f"[bold red]error:[/] {escape(str(exc) + written)}", markup=True, soft_wrap=True
        )
        return STUDY_FILE_LOST_EXIT_CODE
    except OutputsNotWritten as exc:
        # Trials ran (kept in the study); only the files could not be written: not exit 2.
        errors.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, soft_wrap=True)
        return OUTPUTS_NOT_WRITTEN_EXIT_CODE
    except StorageUnavailable as exc:
        # Not a mistake to fix but a server to bring back: the same command then resumes.
        errors.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, soft_wrap=True)
        return OUTAGE_EXIT_CODE
    except AutotuneError as exc:
        # The message quotes user strings (model names, paths): never read them as markup.
        errors.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, soft_wrap=True)
        return 2
    except SearchInterrupted as exc:
        # What finished is written; the exit code is a shell's for that signal (143 for
        # SIGTERM, 129 for SIGHUP, 130 for Ctrl-C), so a scheduler sees why it ended.
        written = f"; wrote {shown_paths(exc.paths)}" if exc.paths else ""
        said = exc.ended or f"interrupted by {exc.signal_name}"  # `interrupted after 2 of 6 ...`
        errors.print(said + written, markup=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        errors.print("interrupted")
        return 128 + signal.SIGINT


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
    estimate.add_parser(commands)
    return parser


def _refuse_dashed_settings(argv: list[str], command: str) -> None:
    """`--model x` or `--model=x` where the command takes `model=x`: say so, not just
    "unrecognized arguments"."""
    settings = _SETTINGS.get(command)
    if settings is None:
        return
    typed, meant = [], []
    for i, token in enumerate(argv):
        key, equals, value = token.removeprefix("--").partition("=")
        key = key.replace("-", "_")  # --seq-len too
        if not token.startswith("--") or key not in settings.model_fields:
            continue
        if equals:
            typed.append(token)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--") and "=" not in argv[i + 1]:
            value = argv[i + 1]
            typed.append(f"{token} {value}")
        else:  # a bare --quiet, or a --model with its value forgotten
            value = "true" if settings.model_fields[key].annotation is bool else "VALUE"
            typed.append(token)
        meant.append(f"{key}={value}")
    if meant:
        raise ConfigError(f"settings are key=value: use {' '.join(meant)}, not {' '.join(typed)}")
