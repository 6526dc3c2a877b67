"""`autotune models`, `autotune spaces`, `autotune validate`: what can be searched."""

from __future__ import annotations

import argparse

from rich.table import Table

from autotune.common.errors import AutotuneError, SpaceError
from autotune.common.models import catalogue_names, catalogue_parameter_counts, resolve_model
from autotune.outputs.terminal import console
from autotune.plan import software_cache
from autotune.plan.space_file import load_space, shipped_names


def add_parsers(commands: argparse._SubParsersAction) -> None:
    models = commands.add_parser("models", help="list the bundled model catalogue")
    models.set_defaults(handler=_models)

    spaces = commands.add_parser("spaces", help="list the shipped search spaces")
    spaces.set_defaults(handler=_spaces)

    validate = commands.add_parser(
        "validate",
        help="check search space files and report every problem",
        description="Check search space YAML files: syntax, knobs, types, empty choices, "
        "conditions, the batch-size rule, and optimizer/compile names against the installed "
        "transformers and torch. Exit 2 on any problem.",
    )
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.set_defaults(handler=_validate)


def _models(args: argparse.Namespace) -> int:
    names = catalogue_names()
    counts = catalogue_parameter_counts()
    table = Table(title="Bundled models (model=NAME)")
    for column in ("name", "architecture", "default task", "parameters", "max seq_len"):
        table.add_column(
            column, justify="right" if column == "parameters" else "left", overflow="fold"
        )
    for name in names:
        spec = resolve_model(name)
        table.add_row(
            name,
            spec.model_type,
            spec.default_task,
            f"{counts[name] / 1e6:,.1f}M",
            str(spec.max_seq_len or "-"),
        )
    console.print(table)
    console.print("model= also takes a local folder with config.json, or a hub id when online.")
    return 0


def _spaces(args: argparse.Namespace) -> int:
    table = Table(title="Shipped search spaces (space=NAME)")
    for column in ("name", "device", "knobs searched", "description"):
        table.add_column(column, overflow="fold")
    for name in shipped_names():
        space = load_space(name)
        searched = [k for k, knob in space.knobs.items() if len(knob.choices) > 1]
        table.add_row(name, space.device, ", ".join(searched), space.description)
    console.print(table)
    console.print("space= also takes a YAML path; `autotune validate FILE` checks one.")
    return 0


def _validate(args: argparse.Namespace) -> int:
    with console.status("reading optimizer and compile backend names from the installed packages"):
        facts = software_cache.software_facts()
    problems = []
    for path in args.files:
        try:
            space = load_space(path, facts)
        except AutotuneError as exc:
            problems.append(str(exc))
            continue
        console.print(f"{path}: ok ({len(space.knobs)} knobs, device {space.device})")
    if problems:
        raise SpaceError("\n".join(problems))
    return 0
