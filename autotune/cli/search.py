"""`autotune search`: parse the settings, run `autotune.api.run` with the terminal view, print
the outcome; the exit code says whether there is something to recommend."""

from __future__ import annotations

import argparse
import textwrap

from autotune import api
from autotune.config import help_rows, load_config
from autotune.view import NOTHING_TO_RECOMMEND, TerminalView, print_outcome, print_paths


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


def _settings_help() -> str:
    rows = help_rows()
    key_width = max(len(r[0]) for r in rows) + 2
    kind_width = min(max(len(r[1]) for r in rows), 24) + 2
    lines = ["settings (key=value; default in brackets):"]
    for key, kind, default, meaning in rows:
        head = f"  {key:<{key_width}}{kind:<{kind_width}}"
        if len(head) > key_width + kind_width + 2:
            head += "\n" + " " * (key_width + kind_width + 2)
        text = textwrap.fill(f"{meaning} [{default}]", width=100 - key_width - kind_width - 2)
        lines.append(head + text.replace("\n", "\n" + " " * (key_width + kind_width + 2)))
    lines += ["", "example:", "  autotune search model=bert-large-uncased seq_len=512 n_trials=30"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.overrides)
    view = TerminalView(quiet=config.quiet)
    result = api.run(config, observer=view, launcher=args.launcher)
    print_outcome(view.report, result.snapshot)
    print_paths(view.report, result.paths)
    return 0 if result.recommended is not None else NOTHING_TO_RECOMMEND
