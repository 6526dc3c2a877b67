"""`autotune report` and `autotune export`: what a user takes away from a finished study."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune import export
from autotune.config import ExportConfig, ReportConfig, help_rows, load_config
from autotune.errors import StudyError
from autotune.records import read_snapshot
from autotune.storage import load_study_dir
from autotune.study_folder import write_study_folder
from autotune.trial import Status
from autotune.units import format_bytes, format_gib
from autotune.view import Reporter, console, print_outcome, print_paths


def add_parsers(commands: argparse._SubParsersAction) -> None:
    for name, schema, handler, summary in (
        ("report", ReportConfig, _report, "rebuild every output of a study from its storage"),
        ("export", ExportConfig, _export, "print a trial's settings as json, yaml, py or cli"),
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
    return 0


def _export(args: argparse.Namespace) -> int:
    config = load_config(args.overrides, ExportConfig)
    snapshot = read_snapshot(load_study_dir(args.study_dir, config.storage, config.study))
    info = snapshot.info
    if config.trial is None:
        record = snapshot.picks.fastest
        if record is None:
            raise StudyError("no trial to recommend in this study; pick one with trial=N")
    elif (record := snapshot.record(config.trial)) is None:
        raise StudyError(f"trial={config.trial}: no finished trial with that number")
    elif record.status is not Status.OK:
        raise StudyError(
            f"trial={record.number} is {record.status.value} ({record.result.reason}): "
            "it has no measured settings to export"
        )
    elif record.result.peak_memory_gib > info.memory_budget_gib:
        raise StudyError(
            f"trial={record.number} is infeasible: its peak "
            f"{format_gib(record.result.peak_memory_gib)} exceeds the memory budget "
            f"{format_bytes(info.memory_budget_bytes)}"
        )
    sys.stdout.write(
        export.render(config.format, info=info, record=record, report_to=config.report_to)
    )
    return 0
