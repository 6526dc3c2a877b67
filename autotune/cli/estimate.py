"""`autotune estimate model=NAME [seq_len=N] [knob=value ...]`: will it fit, before running?

Peak training memory by parts over batch sizes, the largest batch that fits the budget for each
combination of the knobs left free, and the FLOPs of a sample. No torch, no trial: the device's
free memory comes from NVML (or the OS), the parameter count from the catalogue.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import itertools
from collections.abc import Callable
from typing import Any

from rich.markup import escape
from rich.table import Table

from autotune.common import adapter
from autotune.common.adapter import BASE_DTYPES
from autotune.common.device import (
    GPU_MEMORY_MIB,
    bare_name,
    peak_tflops,
)
from autotune.common.errors import AutotuneError, ConfigError
from autotune.common.knob_values import MEMORY_ORDER, TRANSFORMERS_DEFAULT_OPTIM
from autotune.common.knobs import KNOBS, left_out, value_of
from autotune.common.models import ModelSpec, catalogue_parameter_counts, resolve_model
from autotune.common.trial_settings import baseline_params, describe_params
from autotune.common.units import GIB, format_bytes
from autotune.outputs.terminal import console
from autotune.plan import hardware, software_cache
from autotune.plan.capabilities import ADAPTER_KNOBS
from autotune.plan.config import EstimateConfig, RunConfig
from autotune.plan.estimate import PARTS, Estimate, estimate
from autotune.plan.inputs import input_problems
from autotune.plan.overrides import help_rows, make_config, parse_overrides
from autotune.plan.space_file import SoftwareFacts, known_name_problem, normalise_value
from autotune.twin import model as twin

FREE_KNOBS = {"precision": ("fp32", "bf16"), "gradient_checkpointing": (False, True)}
"""Knobs the table varies when not given: those that move memory the most at a given batch."""


def add_parser(commands: argparse._SubParsersAction) -> None:
    rows = "\n".join(f"  {k}={d:<10} {m}" for k, _, d, m in help_rows(EstimateConfig))
    knobs = ", ".join(k for k in KNOBS if k not in ("batch_size",))
    parser = commands.add_parser(
        "estimate",
        help="estimate peak training memory over batch sizes, without training",
        description=f"Settings (key=value):\n{rows}\n\nKnobs (knob=value, the rest at the HF "
        f"defaults; precision and gradient_checkpointing vary when not given): {knobs}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config, knobs = parse(args.overrides)
    model = model_and_gpu(config)  # before the software facts' seconds
    with console.status("reading the model types and optimizer names transformers accepts"):
        facts = software_cache.software_facts()  # cached per user: no torch in this process
    task = check(config, knobs, facts, model)
    device, device_name, budget = _device_and_budget(config)
    parameters = catalogue_parameter_counts().get(model.name)
    devices = config.devices_per_trial
    # tp only where transformers has a tensor-parallel plan for the model (Llama, Qwen2, ...).
    planned = facts.tp_model_types is None or model.config.get("model_type") in facts.tp_model_types
    strategies = tuple(s for s in MEMORY_ORDER if s != "tp" or planned)
    fixed, free = _fixed_and_free(knobs, facts, devices, strategies)
    if config.peft != "none" and "torch_dtype" not in knobs:  # an adapter's first memory lever
        free |= {"torch_dtype": BASE_DTYPES}
    at = _estimator(config, model, task, device, parameters)
    console.print(_heading(config, model, task, device, device_name, budget))
    if device == "cuda" and devices > 1 and not config.gpu:
        link = hardware.link_without_torch(devices)
        known = "not known (NVML could not tell)" if link is None else link.describe()
        console.print(f"between its GPUs: {escape(known)}")
    shown = {k: v for k, v in fixed.items() if k != "batch_size"}
    console.print(f"settings: {escape(describe_params(shown))}")
    if (lora := config.adapter(task)) is not None:
        console.print(_adapter_line(lora, at(fixed)))
    batches = [b for b in (2**k for k in range(13)) if b <= config.max_batch_size]
    if "batch_size" in knobs:
        batches = [knobs["batch_size"]]
    timed = _twin_times(config, model, task, parameters, budget)
    console.print(_memory_table(at, fixed, batches, budget, timed))
    console.print(
        f"largest batch that fits: {_largest(at, fixed, batches, budget) or 'none'}; "
        f"{at(fixed).flops_per_sample / 1e12:.3g} TFLOP per sample (training)"
    )
    if device == "cuda" and (peak := peak_tflops(device_name, "bf16")):
        console.print(_peak_note(device_name, peak, at(fixed).flops_per_sample))
    if timed is not None:
        console.print(_twin_note(config))
    if devices > 1:
        console.print(
            f"model states (weights, gradients, optimizer) per rank of {devices}, "
            f"most to least: {_states(at, fixed, strategies)}"
        )
        console.print(
            "pp: what a pipeline's last stage (its blocks and the LM head) would hold, estimated "
            "only: no Trainer path trains a pipeline here (docs/devices.md#pipeline-parallelism)"
        )
    if free:
        console.print(_grid(free, at, fixed, batches, budget, timed))
    console.print(
        "Estimated by the HF guide's anatomy, before any training: the peak is not the sum, as "
        "gradients fill in while the last backward frees activations. A trial measures it."
    )
    return 0


def named_gpu_memory_bytes(name: str) -> int | None:
    """The memory of the GPU `gpu=` names, by a name of the built-in table or one the twin
    models (its short name or NVML's), whatever the case, spaces and hyphens; never by a
    piece of the name (`gpu=A100,H100` is no GPU). None for one not known."""
    with contextlib.suppress(KeyError):
        return twin.gpu(name).memory_bytes
    return next(
        (mib * 2**20 for piece, mib in GPU_MEMORY_MIB if bare_name(piece) == bare_name(name)),
        None,
    )


def _device_and_budget(config: EstimateConfig) -> tuple[str, str, int]:
    """(`cuda` or `cpu`, the device's name, the memory to fit): `memory_budget=`, else a
    `gpu=`'s memory from the built-in table, else the free memory of the device in hand."""
    if config.gpu:  # a GPU elsewhere, from the built-in table: no NVML needed
        device, device_name = "cuda", config.gpu
        free_bytes = named_gpu_memory_bytes(config.gpu) or 0
    elif config.device == "cuda" and config.memory_budget:  # a GPU elsewhere, no NVML needed
        device, device_name, free_bytes = "cuda", "a GPU of memory_budget", 0
    else:
        device, device_name, free_bytes = hardware.memory_without_torch(config.device)
    return device, device_name, int(config.memory_budget or free_bytes)


def _fixed_and_free(
    knobs: dict[str, Any], facts: SoftwareFacts, devices: int, strategies: tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings every figure is at (the baseline's, with the knobs given) and the knobs the
    grid varies: those of FREE_KNOBS not given, and on several ranks the `strategies`."""
    default_optim = facts.default_optim or TRANSFORMERS_DEFAULT_OPTIM
    fixed = baseline_params(default_optim, None, devices=devices)
    fixed |= {"attn_implementation": "sdpa"} | knobs
    free = {k: v for k, v in FREE_KNOBS.items() if k not in knobs}
    if devices > 1 and "strategy" not in knobs:  # how the ranks share it moves memory most
        free = {"strategy": strategies} | free
    return fixed, free


def _estimator(
    config: EstimateConfig, model: ModelSpec, task: str, device: str, parameters: int | None
) -> Callable[[dict[str, Any]], Estimate]:
    """Settings -> their estimate, for this model, task, seq_len, device and ranks."""

    def at(params: dict[str, Any]) -> Estimate:
        return estimate(
            model.config,
            task=task,
            seq_len=config.seq_len,
            params=params,
            device=device,
            parameters=parameters,
            devices=config.devices_per_trial,
            adapter=config.adapter(task),
        )

    return at


def _heading(
    config: EstimateConfig, model: ModelSpec, task: str, device: str, device_name: str, budget: int
) -> str:
    """The model, its task and seq_len, the device, and the budget with where it comes from."""
    devices = config.devices_per_trial
    per_rank = f", per rank of {devices}" * (devices > 1)
    return (
        f"{escape(model.name)} ({task}), seq_len {config.seq_len}, {device}{per_rank} "
        f"({escape(device_name)}): budget {format_bytes(budget)}"
        + (
            ""
            if config.memory_budget
            else " (its total memory, from the built-in table)"
            if config.gpu
            else " (free now)"
            if device == "cuda"
            else " (free RAM now, less what a search keeps for itself and the machine)"
        )
    )


def _memory_table(
    at: Callable[[dict[str, Any]], Estimate],
    fixed: dict[str, Any],
    batches: list[int],
    budget: int,
    timed: Callable[[dict[str, Any]], tuple[str, str, str]] | None,
) -> Table:
    """Peak memory by part for each batch size, up to the first that does not fit (and the
    twin's times, with `gpu=`)."""
    table = Table(
        title="Peak training memory (GiB) by part"
        + " and the GPU twin's time" * (timed is not None)
    )
    for column in ("batch", *PARTS, "peak", "fits", *(TIME_COLUMNS if timed else ())):
        table.add_column(column, justify="right")
    for batch in batches:
        parts = at(fixed | {"batch_size": batch})
        fits = parts.total <= budget
        table.add_row(
            str(batch),
            *(f"{getattr(parts, p) / GIB:.2f}" for p in PARTS),
            f"{parts.total / GIB:.2f}",
            "yes" if fits else "[red]no[/]",
            *(timed(fixed | {"batch_size": batch}) if timed else ()),
        )
        if not fits:
            break  # larger batches only need more
    return table


def _adapter_line(lora: dict[str, Any], parts: Estimate) -> str:
    """The adapter, what trains of the model, and what the frozen base holds."""
    trained, frozen = parts.trained_parameters, parts.parameters
    return (
        f"adapter: {escape(adapter.describe(lora))}: {trained / 1e6:.1f}M parameters train "
        f"({trained / frozen:.2%} of the base's {frozen / 1e9:.2f}B); the base is frozen: its "
        "gradients and optimizer states are 0 (the gradients and optimizer columns are the "
        "adapter's)"
    )


def _peak_note(device_name: str, peak: float, flops: float) -> str:
    """The GPU's datasheet peaks, and the least time a sample's training takes at the 16-bit one."""
    return (
        f"{escape(device_name)}: datasheet peak {peak_tflops(device_name, 'fp32')} TFLOP/s "
        f"fp32, {peak:g} 16-bit; a sample's training takes at least "
        f"{flops / (peak * 1e12) * 1e3:.3g} ms at the 16-bit peak (trials reach a share "
        "of it: their MFU)"
    )


TIME_COLUMNS = ("step ms", "samples/s", "trial s")


def _twin_times(
    config: EstimateConfig, model: ModelSpec, task: str, parameters: int | None, budget: int
) -> Callable[[dict[str, Any]], tuple[str, str, str]] | None:
    """For `gpu=` naming a GPU the twin models: settings -> its step time, samples/s and a
    trial's wall time (start, build, compile, warm-up and timed steps at the search's
    defaults) as table cells; None otherwise."""
    if not config.gpu:
        return None
    try:
        g = twin.gpu(config.gpu)
    except KeyError:
        return None
    steps = {k: RunConfig.model_fields[k].default for k in ("warmup_steps", "measure_steps")}
    devices = config.devices_per_trial

    def times(params: dict[str, Any]) -> tuple[str, str, str]:
        strategy = value_of(params, "strategy", devices=devices)
        if strategy == "pp":
            return ("-", "-", "-")  # no Trainer path trains a pipeline (PIPELINE_REFUSAL)
        p = twin.predict(
            g,
            model.config,
            task=task,
            seq_len=config.seq_len,
            params=params,
            parameters=parameters,
            devices=devices,
            memory_budget_bytes=budget,
            adapter=config.adapter(task),
            **steps,
        )
        if p.samples_per_s is None:
            return ("oom", "-", f"{p.wall_s:.0f}")
        return (f"{p.step_s * 1e3:.0f}", f"{p.samples_per_s:.1f}", f"{p.wall_s:.0f}")

    return times


def _twin_note(config: EstimateConfig) -> str:
    g = twin.gpu(config.gpu or "")
    uncalibrated = (
        ""
        if g.calibrated
        else f"; not calibrated on the {escape(g.key)}: its datasheet with the constants "
        "fitted there"
    )
    return (
        f"times: the GPU twin of the {escape(g.name)} (a performance model calibrated on "
        "this project's H100 and H200 measurements and the HF guides' published figures, "
        "within 10% of each; "
        f"benchmarks/results/twin-calibration.md{uncalibrated}); a trial: start, build, "
        "compile and warm-up, and the timed steps"
    )


def _largest(at: Any, params: dict[str, Any], batches: list[int], budget: int) -> int | None:
    fitting = None
    for batch in batches:
        if at(params | {"batch_size": batch}).total > budget:
            break
        fitting = batch
    return fitting


def parse(overrides: list[str]) -> tuple[EstimateConfig, dict[str, Any]]:
    """The settings and the knobs given; every problem is named at once."""
    values, problems = parse_overrides(overrides, EstimateConfig)
    knobs: dict[str, Any] = {}
    for key in [k for k in values if k in KNOBS]:
        value, knob = normalise_value(key, values.pop(key)), KNOBS[key]
        if type(value) is not knob.kind or not knob.check(value):
            problems.append(f"{key}={value}: expected {knob.expected}")
        else:
            knobs[key] = value
    unknown = [k for k in values if k not in EstimateConfig.model_fields]
    for key in unknown:
        close = difflib.get_close_matches(key, [*EstimateConfig.model_fields, *KNOBS], n=1)
        problems.append(f"{key}: unknown key" + (f"; did you mean {close[0]}?" if close else ""))
        values.pop(key)
    return make_config(values, EstimateConfig, problems), knobs


def model_and_gpu(config: EstimateConfig) -> ModelSpec:
    """The model, once the checks that need no software facts pass (reading those takes
    seconds the first time): the model can be found, `gpu=` is known and asked for a GPU.
    ConfigError names every problem."""
    problems = []
    if config.gpu and named_gpu_memory_bytes(config.gpu) is None and not config.memory_budget:
        known = ", ".join(name for name, _ in GPU_MEMORY_MIB)
        problems.append(
            f"gpu={config.gpu}: not in the built-in table ({known}); give memory_budget= for it"
        )
    if config.gpu and config.device == "cpu":
        problems.append(f"gpu={config.gpu} with device=cpu: a GPU plan is for device=cuda")
    model = None
    try:
        model = resolve_model(config.model)
    except AutotuneError as exc:
        problems.append(str(exc))
    if problems:
        raise ConfigError("\n".join(problems))
    assert model is not None
    return model


def check(
    config: EstimateConfig, knobs: dict[str, Any], facts: SoftwareFacts, model: ModelSpec
) -> str:
    """The model's task, once the checks `autotune search` runs before any trial pass
    (seq_len within the model's, a model type and head transformers builds, optimizer and
    compile backend names it offers), so no table answers for what the search refuses.
    ConfigError names every problem, in the search's words."""
    problems = []
    for key, value in knobs.items():
        if problem := known_name_problem(key, value, facts):
            problems.append(f"{key}: {problem}")
        if key in ADAPTER_KNOBS and config.peft == "none" and value != left_out(key):
            problems.append(
                f"{key}={value} without peft=lora: it sets the frozen base an adapter trains "
                "on; add peft=lora"
            )
    task = model.default_task if config.task == "auto" else config.task
    problems += input_problems(model, task, config.seq_len, facts)
    if problems:
        raise ConfigError("\n".join(problems))
    return task


def _states(
    at: Callable[[dict[str, Any]], Estimate], fixed: dict[str, Any], strategies: tuple[str, ...]
) -> str:
    """Each strategy's model states on a rank, most held on the device first (ties in the
    catalogue's order), with what offload keeps in host memory."""
    parts = []
    for strategy in strategies:
        figures = at(fixed | {"strategy": strategy})
        held = figures.model_states - figures.offloaded
        host = f" (+{format_bytes(figures.offloaded)} on the host)" * bool(figures.offloaded)
        parts.append((-held, f"{strategy} {format_bytes(held)}{host}"))
    return ", ".join(text for _, text in sorted(parts, key=lambda part: part[0]))


def _grid(
    free: dict[str, list[Any]],
    at: Callable[[dict[str, Any]], Estimate],
    fixed: dict[str, Any],
    batches: list[int],
    budget: float,
    timed: Callable[[dict[str, Any]], tuple[Any, str]] | None,
) -> Table:
    """The largest batch that fits for each combination of the knobs left free: a row for each
    value of the first, a column for each combination of the others (a table of 4 rows where a
    row per combination made 36), each cell `largest batch` (and its samples/s)."""
    first, *others = free
    columns = list(itertools.product(*(free[name] for name in others)))
    grid = Table(
        title="Largest batch that fits, by the knobs left free"
        + (" (samples/s there)" if timed is not None else "")
    )
    grid.add_column(first)
    for values in columns:
        pairs = zip(others, values, strict=True)
        heading = ", ".join(f"{_short(n)}={str(v).lower()}" for n, v in pairs)
        grid.add_column(heading or "largest batch", justify="right")
    for value in free[first]:
        row = [str(value).lower()]
        for values in columns:
            combo = {first: value, **dict(zip(others, values, strict=True))}
            largest = _largest(at, fixed | combo, batches, budget)
            cell = str(largest or "none")
            if timed is not None and largest:
                cell += f" ({timed(fixed | combo | {'batch_size': largest})[1]})"
            row.append(cell)
        grid.add_row(*row)
    return grid


def _short(name: str) -> str:
    return KNOBS[name].short or name if name in KNOBS else name
