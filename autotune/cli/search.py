"""`autotune search`: parse the settings, run `autotune.api.run` with the terminal view, print
the outcome; the exit code says whether there is something to recommend. `autotune worker`:
join a study a search made, from another shell or host (`autotune.api.join`)."""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import textwrap
from pathlib import Path

from pydantic import BaseModel

from autotune import api
from autotune.common.urls import MASK, safe_url
from autotune.outputs.outcome import print_outcome
from autotune.outputs.pareto import NOTHING_TO_RECOMMEND
from autotune.outputs.terminal import console, print_paths
from autotune.outputs.view import TerminalView
from autotune.plan import conditions
from autotune.plan.config import RunConfig, WorkerConfig
from autotune.plan.factory_trust import describe
from autotune.plan.overrides import help_rows, load_config
from autotune.study.opening import join_config


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "search",
        help="tune training settings with short real training runs",
        description="Run an Optuna study over training settings; each trial is a short real "
        "training run in a process of its own. Settings are key=value.",
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="autotune search model=NAME [key=value ...]",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.set_defaults(handler=run)
    parser = commands.add_parser(
        "worker",
        help="join a running study (from another shell or host) and run its trials too",
        description="Join a study that `autotune search` made, and run trials for it until it "
        "has its n_trials. The model, space and settings come from the study. Settings are "
        "key=value.",
        epilog=_settings_help(
            WorkerConfig,
            "autotune worker storage=postgresql://autotune@db-host/autotune study=bert-large",
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="autotune worker study=NAME [storage=URL] [key=value ...]",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.set_defaults(handler=run_worker)


def _settings_help(
    schema: type[BaseModel] = RunConfig,
    example: str = "autotune search model=bert-large-uncased seq_len=512 n_trials=30",
) -> str:
    rows = help_rows(schema)
    key_width = max(len(r[0]) for r in rows) + 2
    kind_width = min(max(len(r[1]) for r in rows), 24) + 2
    lines = ["settings (key=value; default in brackets):"]
    for key, kind, default, meaning in rows:
        head = f"  {key:<{key_width}}{kind:<{kind_width}}"
        if len(head) > key_width + kind_width + 2:
            head += "\n" + " " * (key_width + kind_width + 2)
        text = textwrap.fill(f"{meaning} [{default}]", width=100 - key_width - kind_width - 2)
        lines.append(head + text.replace("\n", "\n" + " " * (key_width + kind_width + 2)))
    lines += ["", "example:", f"  {example}"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.overrides)
    view = TerminalView(quiet=config.quiet)
    result = api.run(
        config, observer=view, executor=args.executor, command=conditions.cli_command(args.argv)
    )
    print_outcome(view.report, result.snapshot)
    print_paths(view.report, result.paths)
    return 0 if result.recommended is not None else NOTHING_TO_RECOMMEND


def run_worker(args: argparse.Namespace) -> int:
    worker = load_config(args.overrides, WorkerConfig)
    log_name = f"workers/{socket.gethostname()}-{os.getpid()}.log"
    view = TerminalView(quiet=worker.quiet, log_name=log_name)
    # What the worker will import, shown before anything is (join_config refuses a file that
    # is not the one the search checked, or the worker's own trainer=).
    trainer = join_config(worker).trainer
    if trainer and not worker.quiet:
        console.print(
            f"trainer={trainer}: runs {describe(trainer, Path.cwd())}", markup=False, soft_wrap=True
        )
    plan, _ = api.join(
        worker, observer=view, executor=args.executor, command=conditions.cli_command(args.argv)
    )
    shown = safe_url(plan.storage_url)
    storage, study = f"storage={shown}", f"study={plan.study_name}"
    report = shlex.join(["autotune", "report", str(plan.study_dir), storage, study])
    if shown != plan.storage_url:  # the password is never printed: the user has it
        report += f"   ({MASK}: put the password back)"
    if not worker.quiet:
        console.print(f"the study's outputs: {report}", markup=False, soft_wrap=True)
    return 0
