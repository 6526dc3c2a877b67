"""`autotune` command line: parse, build, run, print. The only place that prints errors and picks
exit codes (2 for a problem the user can fix, 130 for Ctrl-C)."""

from __future__ import annotations

import argparse
import sys
import textwrap

import optuna
from rich.console import Console
from rich.table import Table

from autotune import __version__, hardware
from autotune.config import help_rows, load_config
from autotune.errors import AutotuneError, SpaceError
from autotune.models import catalogue_names, count_parameters, resolve_model
from autotune.outputs import SearchOutputs, describe_baseline, write_outputs
from autotune.plan import SearchPlan, make_plan
from autotune.records import TrialRecord, describe_params, load_records
from autotune.space import SoftwareFacts, load_space, shipped_names
from autotune.study import open_study, retry_interrupted, run_search
from autotune.trial import Status

# Piped output (logs, CI) gets long lines instead of rich's 80-column default, so names and
# settings are never cut or folded.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
errors = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)


def main(argv: list[str] | None = None) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own lines say what happens
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except AutotuneError as exc:
        errors.print(f"[bold red]error:[/] {exc}", markup=True, soft_wrap=True)
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

    search = commands.add_parser(
        "search",
        help="tune training settings with short real training runs",
        description="Run an Optuna study over training settings; each trial is a short real "
        "training run in a process of its own. Settings are key=value.",
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="autotune search model=NAME [key=value ...]",
    )
    search.add_argument("overrides", nargs="*", metavar="key=value")
    search.set_defaults(handler=_search)

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
    return parser


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


def _search(args: argparse.Namespace) -> int:
    config = load_config(args.overrides)
    with console.status("probing the device"):
        device_info = hardware.probe()
    plan = make_plan(config, device_info)
    _print_plan(plan)
    study = open_study(plan)
    done_before = len(load_records(study))
    if done_before:
        console.print(f"resuming: {done_before} finished trial(s) kept")
    for number in retry_interrupted(study):
        console.print(f"trial {number} was interrupted: its settings run again first")
    progress = {"done": done_before}

    def on_trial_end(record: TrialRecord) -> None:
        progress["done"] += 1
        console.print(_trial_line(record, progress["done"], config.n_trials))

    try:
        with console.status("running trials (each is a real training run)"):
            stopped = run_search(plan, study, on_trial_end=on_trial_end)
        console.print(f"search ended: {stopped}")
    finally:
        # Ctrl-C included: what finished is written before the process ends.
        outputs = write_outputs(plan, study)
    _print_outputs(plan, outputs)
    return 0


def _print_plan(plan: SearchPlan) -> None:
    budget_gib = plan.memory_budget_bytes / 1024**3
    console.print(
        f"study [bold]{plan.study_name}[/]: {plan.model.name} ({plan.task}), seq_len "
        f"{plan.config.seq_len}, {plan.device} ({plan.device_name}), space {plan.space.name}, "
        f"budget {budget_gib:.1f} GiB, {plan.config.n_trials} trials -> {plan.study_dir}"
    )
    console.print(f"batch: {plan.batch_mode}")
    for note in plan.space.notes:
        console.print(f"[yellow]note:[/] {note}")


def _trial_line(record: TrialRecord, done: int, total: int) -> str:
    r = record.result
    status = r.status.value if r.status is Status.OK else f"[red]{r.status.value}[/]"
    head = f"[{done}/{total}] trial {record.number:>3} {status:<7} {describe_params(record.params)}"
    if r.status is Status.OK:
        return (
            f"{head}: {r.samples_per_s:.2f} samples/s, {r.peak_memory_gib:.3f} GiB, "
            f"step CV {r.step_time_cv:.0%}, {r.wall_s:.1f} s"
        )
    return f"{head}: {r.reason}"


def _print_outputs(plan: SearchPlan, outputs: SearchOutputs) -> None:
    picks = outputs.picks
    table = Table(title="Pareto front (fastest first)")
    for column in ("trial", "settings", "samples/s", "x baseline", "peak GiB", "MFU", "step CV"):
        table.add_column(column, justify="left" if column == "settings" else "right")
    for record in outputs.front:
        r = record.result
        marks = ((picks.fastest, " *"), (picks.saver, " m"))
        mark = "".join(m for pick, m in marks if pick is not None and pick.number == record.number)
        table.add_row(
            f"{record.number}{mark}",
            describe_params(record.params),
            f"{r.samples_per_s:.2f}",
            _times(picks.speedup(record)),
            f"{r.peak_memory_gib:.3f}",
            "n/a" if r.mfu is None else f"{r.mfu:.1%}",
            f"{r.step_time_cv:.0%}" + (" noisy" if r.step_time_cv > plan.config.noise_cv else ""),
        )
    console.print(table)
    console.print(f"baseline: {describe_baseline(picks)}")
    if picks.baseline is not None and picks.baseline.result.samples_per_s is None:
        console.print("[yellow]the HF defaults did not run here, so there is no speedup figure[/]")
    if picks.fastest is None:
        console.print(
            f"[yellow]no successful trial stays below {outputs.memory_limit_gib:.2f} GiB "
            "(budget less headroom): nothing to recommend[/]"
        )
    else:
        fastest, saver = picks.fastest, picks.saver
        console.print(
            f"recommended (*): {picks.describe(fastest)}: {describe_params(fastest.params)}"
        )
        if saver.number == fastest.number:
            console.print("memory saver (m): the same trial: nothing within 10% uses less memory")
        else:
            console.print(
                f"memory saver (m): {picks.describe(saver)}: {describe_params(saver.params)}"
            )
    console.print("wrote " + ", ".join(str(p) for p in outputs.paths))


def _times(speedup: float | None) -> str:
    return "n/a" if speedup is None else f"{speedup:.2f}x"


def _models(args: argparse.Namespace) -> int:
    names = catalogue_names()
    with console.status("counting parameters on the meta device"):
        counts = count_parameters(names)
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
        info = hardware.probe()
    facts = SoftwareFacts(
        optimizer_names=info.optimizer_names, compile_backends=info.compile_backends
    )
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


if __name__ == "__main__":
    sys.exit(main())
