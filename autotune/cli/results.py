"""`autotune report` and `autotune export`: what a user takes away from a finished study."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from rich.markup import escape

from autotune import api
from autotune.common.errors import StudyError
from autotune.common.trial import Status
from autotune.common.units import format_bytes, format_gib
from autotune.outputs import export
from autotune.outputs.outcome import print_outcome
from autotune.outputs.pareto import NOTHING_TO_RECOMMEND
from autotune.outputs.snapshot import StudySnapshot, read_snapshot
from autotune.outputs.study_folder import write_study_folder
from autotune.outputs.terminal import Reporter, console, print_paths
from autotune.outputs.view import TerminalView
from autotune.plan import conditions
from autotune.plan.config import ConfirmConfig, ExportConfig, ReportConfig, VerifyConfig
from autotune.plan.overrides import help_rows, load_config
from autotune.store.outcomes import Ending
from autotune.store.storage import load_study_dir
from autotune.study.interrupts import SearchInterrupted


def add_parsers(commands: argparse._SubParsersAction) -> None:
    for name, schema, handler, summary in (
        ("report", ReportConfig, _report, "rebuild every output of a study from its storage"),
        ("export", ExportConfig, _export, "print a trial's settings as json, yaml, py or cli"),
        (
            "confirm",
            ConfirmConfig,
            _confirm,
            "measure a study's baseline and picks again, interleaved, and rebuild its outputs",
        ),
        (
            "verify",
            VerifyConfig,
            _verify,
            "train the recommended settings for many steps, compare with their trial, and rebuild "
            "the study's outputs",
        ),
    ):
        parser = commands.add_parser(
            name,
            help=summary,
            description=summary + ".",
            epilog="settings (key=value):\n"
            + "\n".join(
                f"  {key:<9}{kind:<22}{meaning} [{default}]"
                for key, kind, default, meaning in help_rows(schema)
            ),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument("study_dir", type=Path, metavar="STUDY_DIR")
        parser.add_argument("overrides", nargs="*", metavar="key=value")
        parser.set_defaults(handler=handler)


def _report(args: argparse.Namespace) -> int:
    config = load_config(args.overrides, ReportConfig)
    snapshot = read_snapshot(load_study_dir(args.study_dir, config.storage, config.study))
    with console.status("building the report"):
        paths = write_study_folder(snapshot, args.study_dir)
    report = Reporter()
    print_outcome(report, snapshot)
    print_paths(report, paths)
    return _exit_code(snapshot)


def _exit_code(snapshot: StudySnapshot) -> int:
    """The code its search exited with: the signal's (130, 143, 129) when it was interrupted,
    else 3 when there is nothing to recommend (also after a timeout), else 0."""
    ended = snapshot.ended
    if ended is not None and ended.how is Ending.INTERRUPTED and ended.signal:
        return SearchInterrupted(signal.Signals[ended.signal]).exit_code
    return 0 if snapshot.picks.recommended is not None else NOTHING_TO_RECOMMEND


def _confirm(args: argparse.Namespace) -> int:
    config = load_config(args.overrides, ConfirmConfig)
    view = TerminalView(quiet=config.quiet)
    result = api.confirm_study(
        args.study_dir,
        rounds=config.rounds,
        storage=config.storage,
        study=config.study,
        observer=view,
        executor=args.executor,
        command=conditions.cli_command(args.argv),
    )
    print_outcome(view.report, result.snapshot)
    print_paths(view.report, result.paths)
    return 0 if result.recommended is not None else NOTHING_TO_RECOMMEND


def _verify(args: argparse.Namespace) -> int:
    config = load_config(args.overrides, VerifyConfig)
    view = TerminalView(quiet=config.quiet)
    verified, result = api.verify_study(
        args.study_dir,
        trial=config.trial,
        steps=config.steps,
        storage=config.storage,
        study=config.study,
        observer=view,
        executor=args.executor,
        command=conditions.cli_command(args.argv),
    )
    view.report.line(f"verified: {escape(verified.describe())}")
    print_paths(view.report, result.paths)
    return 0 if verified.status == Status.OK.value else 1


def _export(args: argparse.Namespace) -> int:
    config = load_config(args.overrides, ExportConfig)
    snapshot = read_snapshot(load_study_dir(args.study_dir, config.storage, config.study))
    info = snapshot.info
    if config.trial is None:
        record = snapshot.picks.recommended
        if record is None:
            raise StudyError("no trial to recommend in this study; pick one with trial=N")
    elif (record := snapshot.record(config.trial)) is None:
        raise StudyError(f"trial={config.trial}: no finished trial with that number")
    elif record.status is not Status.OK:
        raise StudyError(
            f"trial={record.number} is {record.status.value} ({record.result.reason}): "
            "it has no measured settings to export"
        )
    elif not record.result.feasible(info.memory_budget_gib):
        raise StudyError(
            f"trial={record.number} is infeasible: its peak "
            f"{format_gib(record.result.peak_memory_gib)} exceeds the memory budget "
            f"{format_bytes(info.memory_budget_bytes)}"
        )
    sys.stdout.write(
        export.render(config.format, info=info, record=record, report_to=config.report_to)
    )
    return 0
