"""Fit a search space to the device in hand: remove values that cannot run, say why.

Runs in the parent on the facts of the device probe (`DeviceInfo`); the notes it returns are
shown to the user and stored with the study.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

from autotune.common.adapter import BASE_DTYPES, QUANTIZATIONS
from autotune.common.device import DeviceInfo
from autotune.common.errors import SpaceError
from autotune.common.knob_values import (
    BNB_OPTIMIZERS,
    FLASH_ATTENTION,
    FSDP,
    OFFLOADED,
    PIPELINE_REFUSAL,
    STRATEGIES,
    TENSOR_PARALLEL_ON_CPU,
    TORCHAO_OPTIMIZERS,
    ZERO_STAGES,
    precision_parts,
)
from autotune.common.knobs import KNOBS
from autotune.common.placement import Placement
from autotune.plan.space import SearchSpace, SpaceKnob

DeviceLimit = Callable[[Any, str, DeviceInfo], str | None]
"""(value, device, facts) -> why the value cannot run there, or None."""


def _precision(value: str, device: str, info: DeviceInfo) -> str | None:
    parts = precision_parts(value)
    if device == "cpu" and "fp16" in parts:
        return "the Trainer ignores fp16 on CPU: it would silently run as fp32"
    if device == "cpu" and "tf32" in parts:
        return "tf32 is a CUDA tensor-core mode (TrainingArguments refuses it on CPU)"
    if device == "cuda" and "tf32" in parts and not info.tf32_supported:
        return f"tf32 needs an Ampere or newer GPU (this one is {info.compute_capability})"
    if device == "cuda" and "bf16" in parts and not info.bf16_supported:
        return f"bf16 needs an Ampere or newer GPU (this one is {info.compute_capability})"
    if "fp8" in parts and not info.capability_at_least(8, 9):
        this = f" (this one is {info.compute_capability})" if device == "cuda" else ""
        return f"fp8 matmuls need a GPU of compute capability 8.9 or newer (Ada, Hopper){this}"
    if "fp8" in parts and info.torchao_error:
        return (
            f"fp8 trains through torchao's Float8Linear; torchao does not import here "
            f"({info.torchao_error})"
        )
    if device == "cpu" and "bf16" in parts and not info.bf16_supported:
        return (
            "this CPU has no bf16 instructions (AVX-512 BF16, AMX; oneDNN's test): autocast "
            "emulates bf16 there, several times slower than fp32 (10x measured on AVX2)"
        )
    return None


def _optim(value: str, device: str, info: DeviceInfo) -> str | None:
    if value in BNB_OPTIMIZERS and info.bitsandbytes_error:
        return f"bitsandbytes does not import here ({info.bitsandbytes_error})"
    if value in TORCHAO_OPTIMIZERS and info.torchao_error:
        return f"torchao does not import here ({info.torchao_error})"
    if value.startswith("paged_") and device == "cpu":
        return "paged optimizers page their state between GPU and host memory: CUDA only"
    return None


def _torch_compile(value: str, device: str, info: DeviceInfo) -> str | None:
    if value == "cudagraphs" and device == "cpu":
        return "the cudagraphs backend records CUDA graphs: CUDA only"
    return None


def _compile_mode(value: str, device: str, info: DeviceInfo) -> str | None:
    if value == "reduce-overhead" and device == "cpu":
        return "reduce-overhead works through CUDA graphs: CUDA only"
    return None


def _strategy(value: str, device: str, info: DeviceInfo) -> str | None:
    if value == "pp":
        return PIPELINE_REFUSAL
    if value == "tp" and device == "cpu":
        return TENSOR_PARALLEL_ON_CPU
    if value == "dp" and device == "cpu":
        return "DataParallel drives the CUDA devices one process sees: on CPU there are none"
    if value in ZERO_STAGES and info.deepspeed_error:
        return f"DeepSpeed does not import here ({info.deepspeed_error})"
    if value in OFFLOADED and device == "cpu":
        return "offload moves model states from GPU memory to the host's: on CPU they are there"
    return None


def _attention(value: str, device: str, info: DeviceInfo) -> str | None:
    if value not in FLASH_ATTENTION:
        return None
    if device == "cpu":
        return "FlashAttention's kernels run on CUDA GPUs only"
    version, error, (major, generation) = (
        ("2", info.flash_attn_error, (8, "Ampere"))
        if value == "flash_attention_2"
        else ("3", info.flash_attn_3_error, (9, "Hopper"))
    )
    if not info.capability_at_least(major):
        return (
            f"FlashAttention {version} needs a{'n' * (generation == 'Ampere')} {generation} "
            f"or newer GPU (this one is {info.compute_capability})"
        )
    if error:
        return f"FlashAttention {version} does not import here ({error})"
    return None


def _liger(value: bool, device: str, info: DeviceInfo) -> str | None:
    if value and device == "cpu":
        return "Liger's kernels are Triton kernels for CUDA GPUs"
    if value and info.liger_error:
        return f"liger-kernel does not import here ({info.liger_error})"
    return None


def _activation_offload(value: bool, device: str, info: DeviceInfo) -> str | None:
    if value and device == "cpu":
        return "it moves saved activations from GPU memory to the host's: on CPU they are there"
    return None


def _packing(value: bool, device: str, info: DeviceInfo) -> str | None:
    if value and device == "cpu":
        return (
            "packed samples stay apart only under FlashAttention's variable-length kernel, "
            "a CUDA one (under SDPA or eager attention they attend to each other)"
        )
    return None


def _shown(value: Any) -> str:
    """A value as a space file writes it (booleans `true`/`false`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _model_limits(
    space: SearchSpace, info: DeviceInfo, model: tuple[str, str] | None
) -> list[tuple[str, Any, str]]:
    """(knob, value, why) for values this model cannot train with: Liger's kernels exist for
    some model types only; packing flattens a causal LM's samples into one row, which a head
    with a label per sample cannot take."""
    if model is None:
        return []
    model_type, task = model
    limits = []
    liger = space.knobs.get("use_liger_kernel")
    if liger and True in liger.choices and model_type not in info.liger_model_types:
        patched = ", ".join(info.liger_model_types) or "none here"
        why = f"Liger has no kernels for {model_type} models (it patches: {patched})"
        limits.append(("use_liger_kernel", True, why))
    strategy = space.knobs.get("strategy")
    if strategy and "tp" in strategy.choices and model_type not in info.tp_model_types:
        planned = sorted(info.tp_model_types)
        listed = ", ".join(planned[:4]) + (", ..." if len(planned) > 4 else "")
        known = f"it has one for {len(planned)}: {listed}" if planned else "the probe found none"
        why = f"the installed transformers has no tensor-parallel plan for {model_type} models"
        limits.append(("strategy", "tp", f"{why} ({known})"))
    packing = space.knobs.get("packing")
    if packing and True in packing.choices and task != "causal-lm":
        why = (
            f"packing flattens causal-lm samples into one row; a {task} model keeps its "
            "samples apart"
        )
        limits.append(("packing", True, why))
    return limits


def _base_dtype(value: str, device: str, info: DeviceInfo) -> str | None:
    if value == "bf16" and not info.bf16_supported:
        where = "GPU" if device == "cuda" else "CPU"
        return f"this {where} has no bf16 arithmetic: a bf16 base would be emulated"
    return None


def _quantization(value: str, device: str, info: DeviceInfo) -> str | None:
    if value != "none" and info.bitsandbytes_error:
        error = info.bitsandbytes_error
        return f"a quantized base is bitsandbytes'; it does not import here ({error})"
    return None


def _pin_memory(value: bool, device: str, info: DeviceInfo) -> str | None:
    if value and device == "cpu":
        return "pinned memory only speeds host-to-GPU copies: there are none on CPU"
    return None


DEVICE_LIMITS: dict[str, DeviceLimit] = {
    "precision": _precision,
    "optim": _optim,
    "torch_compile": _torch_compile,
    "compile_mode": _compile_mode,
    "dataloader_pin_memory": _pin_memory,
    "strategy": _strategy,
    "attn_implementation": _attention,
    "use_liger_kernel": _liger,
    "activation_offload": _activation_offload,
    "packing": _packing,
    "torch_dtype": _base_dtype,
    "quantization": _quantization,
}


DataSource = Literal["synthetic", "data", "trainer"]
"""What trials train on: random tokens, the user's data (`data=`), the user's Trainer."""


def fit_space(
    space: SearchSpace,
    device: str,
    info: DeviceInfo,
    source: DataSource = "synthetic",
    cores: int | None = None,
    devices: int = 1,
    model: tuple[str, str] | None = None,
    adapter: bool = False,
) -> SearchSpace:
    """The space less what cannot run on `device` with `cores` CPU cores a trial (`trial_cores`;
    None: not fitted to them) and `devices` ranks, or for `model` (its model type and task;
    None: not fitted to it), or cannot matter for the data trained on; with an `adapter`
    (`peft=lora`) the base's dtype and quantization join it. The reasons are in the result's
    notes."""
    # First: on several devices the strategy joins the space, and is fitted as the rest; so
    # do the base's knobs with an adapter.
    added = devices > 1 and "strategy" not in space.knobs
    space, device_notes = _fit_strategy(space, devices, device)
    space, adapter_notes = _fit_to_adapter(space, adapter)
    device_notes += adapter_notes
    notes = []
    emptied = []
    for name, knob in space.knobs.items():
        limit = DEVICE_LIMITS.get(name)
        if limit is None:
            continue
        kept, removed = [], []
        for value in knob.choices:
            reason = limit(value, device, info)
            if reason:
                removed.append(f"{name}={_shown(value)}: {reason}")
            else:
                kept.append(value)
        if removed and not kept:
            emptied.append(f"{name}: every value is removed on {device}: " + "; ".join(removed))
        elif removed:
            notes += [f"removed {r}" for r in removed]
            space = space.with_choices(name, tuple(kept))
    for name, value, reason in _model_limits(space, info, model):
        if space.knobs[name].choices == (value,):
            emptied.append(f"{name}: its only value {_shown(value)} is removed: {reason}")
        else:
            notes.append(f"removed {name}={_shown(value)}: {reason}")
            space = space.with_choices(
                name, tuple(v for v in space.knobs[name].choices if v != value)
            )
    if emptied:
        raise SpaceError(
            f"space {space.name} cannot run here:\n" + "\n".join(f"  - {e}" for e in emptied)
        )
    space, tp_notes = _fit_tp_size(space, devices)
    notes += tp_notes
    space, data_notes = _fit_to_data(space, source)
    # After the data: synthetic data fixes the loader at 0 workers, which needs no note here.
    space, core_notes = _fit_to_cores(space, cores)
    space = with_strategy_knobs(space)  # of the strategies the rules above left
    if added:  # the strategies searched: those left after the rules above
        device_notes = [_searched(space.knobs["strategy"].choices, devices)]
    notes = device_notes + notes + data_notes + core_notes
    return replace(space, notes=space.notes + tuple(notes))


SEVERAL_DEVICES = tuple(s for s in STRATEGIES if s not in ("single", "pp"))
"""What a trial on several devices searches where the space names no strategy (`pp` cannot
run: `PIPELINE_REFUSAL`)."""
DDP_KNOBS = {
    "ddp_find_unused_parameters": (False, True),
    "ddp_bucket_cap_mb": (10, 25, 100),
    "ddp_static_graph": (False, True),
    "gradient_as_bucket_view": (False, True),
}
"""DDP's own settings, searched with it on several devices unless the space names them."""
FSDP_KNOBS = {"fsdp_prefetch": (False, True)}
"""FSDP2's, searched with its strategies unless the space names them."""
ZERO_KNOBS = {"zero_overlap_comm": (False, True)}
"""DeepSpeed's own settings, searched with its strategies unless the space names them."""
STRATEGY_KNOBS = (
    (DDP_KNOBS, lambda strategy: strategy == "ddp"),
    (FSDP_KNOBS, lambda strategy: strategy in FSDP),
    (ZERO_KNOBS, lambda strategy: strategy in ZERO_STAGES),
)


def fit_tp_to_run(
    space: SearchSpace, *, trainer: bool, fixed_batch: bool, adapter: bool = False
) -> SearchSpace:
    """Without `strategy=tp` where the run cannot hold it: the user's Trainer factory builds
    its model whole (autotune builds a tp trial's split), peft's layers are not applied to
    split weights, and `effective_batch_size` is split over every rank, where a
    tensor-parallel group's ranks train on one batch."""
    knob = space.knobs.get("strategy")
    if knob is None or "tp" not in knob.choices:
        return space
    if trainer:
        why = "trainer= builds the model whole; a tp trial's model is built split by autotune"
    elif adapter:
        why = (
            "an adapter trains on a base replicated on each rank here: peft's layers are not "
            "applied to tensor-parallel (DTensor) weights"
        )
    elif fixed_batch:
        why = (
            "effective_batch_size= is split over every rank, and a tensor-parallel group's "
            "ranks train on one batch"
        )
    else:
        return space
    if knob.choices == ("tp",):
        raise SpaceError(f"space {space.name} cannot run here:\n  - strategy=tp: {why}")
    fitted = with_strategy_knobs(
        space.with_choices("strategy", tuple(v for v in knob.choices if v != "tp"))
    )
    return replace(fitted, notes=(*fitted.notes, f"removed strategy=tp: {why}"))


def tp_sizes(devices: int) -> tuple[int, ...]:
    """The tensor-parallel group sizes that split `devices` ranks into equal groups."""
    return tuple(n for n in range(2, devices + 1) if devices % n == 0)


def _fit_tp_size(space: SearchSpace, devices: int) -> tuple[SearchSpace, list[str]]:
    """`tp_size` values that split the trial's `devices` into equal tensor-parallel groups
    (the groups, if several, shard the rest between them); searched among all of those with
    `strategy=tp` unless the space names some."""
    knob = space.knobs.get("tp_size")
    strategy = space.knobs.get("strategy")
    if strategy is None or "tp" not in strategy.choices:
        return space, []  # no tp left to split: `with_strategy_knobs` drops a named tp_size
    if knob is None:
        sizes = tp_sizes(devices)
        if len(sizes) < 2:
            return space, []  # left out: one group of every device
        knobs = {**space.knobs, "tp_size": SpaceKnob(name="tp_size", choices=sizes)}
        note = f"tp_size searched among {', '.join(map(str, sizes))}: {devices} devices per trial"
        return replace(space, knobs=knobs), [note]
    kept = tuple(v for v in knob.choices if devices % v == 0)
    if not kept:
        values = ", ".join(map(str, knob.choices))
        raise SpaceError(
            f"space {space.name} cannot run here:\n  - tp_size: none of its values ({values}) "
            f"divides devices_per_trial={devices}"
        )
    removed = [v for v in knob.choices if v not in kept]
    notes = [f"removed tp_size={v}: does not divide devices_per_trial={devices}" for v in removed]
    return (space.with_choices("tp_size", kept) if removed else space), notes


def fit_to_devices(
    space: SearchSpace, devices: int, device: str = "cpu"
) -> tuple[SearchSpace, list[str]]:
    """On one device a trial has no strategy to choose (the knob leaves the space) but, on a
    GPU, offloading model states to the host, where the space names it; on several it has
    one, searched among every multi-device strategy unless the space lists some. A
    strategy's own settings (DDP's, DeepSpeed's) are searched with it."""
    space, notes = _fit_strategy(space, devices, device)
    return with_strategy_knobs(space), notes


def _searched(strategies: Sequence[str], devices: int) -> str:
    return f"strategy searched among {', '.join(strategies)}: {devices} devices per trial"


def with_strategy_knobs(space: SearchSpace) -> SearchSpace:
    """The space with the settings of its strategies (at their values unless the space names
    them) and without those of strategies it cannot run, which could never take effect."""
    knob = space.knobs.get("strategy")
    strategies = knob.choices if knob is not None else ("single",)
    knobs = dict(space.knobs)
    for settings, applies in STRATEGY_KNOBS:
        used = any(applies(s) for s in strategies)
        for name, values in settings.items():
            if not used:
                knobs.pop(name, None)
            elif name not in knobs:
                knobs[name] = SpaceKnob(name=name, choices=values)
    if "tp" not in strategies:  # its sizes depend on the devices: added by `_fit_tp_size`
        knobs.pop("tp_size", None)
    return replace(space, knobs=knobs)


def _fit_strategy(space: SearchSpace, devices: int, device: str) -> tuple[SearchSpace, list[str]]:
    knob = space.knobs.get("strategy")
    if devices == 1:
        if knob is None:
            return space, []
        one = ("single", *OFFLOADED) if device == "cuda" else ("single",)
        kept = tuple(v for v in knob.choices if v in one)
        if not kept:
            values = ", ".join(knob.choices)
            raise SpaceError(
                f"space {space.name} cannot run here:\n  - strategy: its values "
                f"({values}) need devices_per_trial of 2 or more"
            )
        if kept != ("single",):  # offload on one GPU: for a model that does not fit it
            removed = [v for v in knob.choices if v not in kept]
            notes = [f"removed strategy={v}: needs devices_per_trial of 2 or more" for v in removed]
            return space.with_choices("strategy", kept), notes
        knobs = {k: v for k, v in space.knobs.items() if k != "strategy"}
        return replace(space, knobs=knobs), ["strategy fixed at single: one device per trial"]
    if knob is None:
        knobs = {**space.knobs, "strategy": SpaceKnob(name="strategy", choices=SEVERAL_DEVICES)}
        return replace(space, knobs=knobs), [_searched(SEVERAL_DEVICES, devices)]
    if "single" not in knob.choices:
        return space, []
    return space, [
        f"strategy=single trains on one of a trial's {devices} devices: the reference of the "
        "others' scaling efficiency"
    ]


def fit_to_nodes(space: SearchSpace, nodes: int) -> SearchSpace:
    """A trial across `nodes` nodes (`executor=ray`) runs its ranks as processes on each:
    DataParallel, one process, cannot span them, and leaves the space with the reason."""
    knob = space.knobs.get("strategy")
    if nodes == 1 or knob is None or "dp" not in knob.choices:
        return space
    kept = tuple(v for v in knob.choices if v != "dp")
    if not kept:
        raise SpaceError(
            f"space {space.name} cannot run here:\n  - strategy: dp is one process, and a "
            f"trial here spans {nodes} nodes"
        )
    note = f"removed strategy=dp: DataParallel is one process, and a trial here spans {nodes} nodes"
    return replace(space.with_choices("strategy", kept), notes=(*space.notes, note))


ADAPTER_KNOBS = {"torch_dtype": BASE_DTYPES, "quantization": QUANTIZATIONS}
"""The frozen base's settings: searched with an adapter (every value) unless the space names
them; they cannot apply to a full fine-tune, which trains every weight."""


def _fit_to_adapter(space: SearchSpace, adapter: bool) -> tuple[SearchSpace, list[str]]:
    knobs = dict(space.knobs)
    notes = []
    for name, values in ADAPTER_KNOBS.items():
        if adapter and name not in knobs:
            knobs[name] = SpaceKnob(name=name, choices=values)
        elif not adapter and name in knobs:
            del knobs[name]
            notes.append(
                f"removed {name}: it sets the frozen base an adapter trains on (peft=lora); a "
                "full fine-tune trains every weight"
            )
    return replace(space, knobs=knobs), notes


def trial_cores(slots: Sequence[Placement]) -> int | None:
    """The CPU cores each trial has: its worker's own set, or where workers are not pinned to
    cores (one per GPU, or one worker) an even share of this process's. None: no slots."""
    if not slots:
        return None
    if slots[0].node_cpus is not None:  # on a cluster: what the trial takes of each node
        return slots[0].node_cpus * slots[0].nodes
    unpinned = sum(s.cpus is None for s in slots)
    shared = len(os.sched_getaffinity(0)) // max(unpinned, 1) or 1
    return min(shared if s.cpus is None else len(s.cpus) for s in slots)


def _fit_to_cores(space: SearchSpace, cores: int | None) -> tuple[SearchSpace, list[str]]:
    """Loader workers are processes of their own, beside the trial's: more of them than the
    trial has cores only take turns on those cores, and slow the step they should feed."""
    knob = space.knobs.get("dataloader_num_workers")
    if cores is None or knob is None:
        return space, []
    kept = tuple(v for v in knob.choices if v <= cores)
    removed = [v for v in knob.choices if v > cores]
    if not removed:
        return space, []
    shown = ", ".join(map(str, removed))  # one note for a range's many values
    why = (
        f"a trial has {cores} CPU core{'s' * (cores != 1)}, and each loader worker is a "
        "process that would take turns on them"
    )
    if not kept:
        raise SpaceError(
            f"space {space.name} cannot run here:\n  - dataloader_num_workers: every value "
            f"({shown}) is above the cores a trial has ({why}); give values up to {cores}"
        )
    space = space.with_choices("dataloader_num_workers", kept)
    return space, [f"removed dataloader_num_workers above {cores} ({shown}): {why}"]


def _fit_to_data(space: SearchSpace, source: DataSource) -> tuple[SearchSpace, list[str]]:
    """Synthetic samples are in memory and of one length: loader and padding knobs are fixed
    (at the HF default where the space allows it). A user's Trainer has its own collator."""
    notes = []
    for name, knob in space.knobs.items():
        catalogue = KNOBS[name]
        if source == "trainer" and catalogue.collator:
            knobs = {k: v for k, v in space.knobs.items() if k != name}
            space = replace(space, knobs=knobs)
            notes.append(
                f"removed {name}: it sets autotune's collator, and trainer= brings its own"
            )
        elif source == "synthetic" and catalogue.data_only and len(knob.choices) > 1:
            value = catalogue.baseline if catalogue.baseline in knob.choices else knob.choices[0]
            space = space.with_choices(name, (value,))
            notes.append(
                f"{name} fixed at {str(value).lower()}: the data is synthetic, in memory and "
                "of one length, so it cannot matter here (give data= to search it)"
            )
    return space, notes
