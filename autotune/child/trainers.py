"""The Trainer a trial times: the HF `Trainer` on the model built from its config (random
tokens, or the user's prepared data), or the one the user's factory (`trainer=`) makes; both
with the tuned `TrainingArguments` plus what every trial runs with."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import transformers

from autotune.child import data, measure, rank_training, ranks, rows
from autotune.child import factory as factories
from autotune.child.models import build_model
from autotune.common import knobs
from autotune.common.models import ModelSpec, task_of_class
from autotune.common.trial import TrialSpec
from autotune.common.user_data import read_ready


class InvalidConfig(Exception):
    """The settings were refused before training started."""


ARG_FIELDS = frozenset(f.name for f in dataclasses.fields(transformers.TrainingArguments))
"""The installed transformers' TrainingArguments fields (names change between releases)."""


def our_trainer(
    spec: TrialSpec,
    tuned_args: dict[str, Any],
    model_kwargs: dict[str, Any],
    workdir: str,
    clock: measure.StageClock,
    rank: ranks.Rank | None = None,
) -> transformers.Trainer:
    """The HF Trainer on the model built from its config, with random tokens or the user's
    prepared data (`data=`), memory-mapped here, after the fork: the fork server never loads
    data, so no arrow thread or mapping crosses a fork."""
    run_only = {"remove_unused_columns": False} if spec.data_dir else {}
    # The collator reads only the columns it needs; kept, the `length` column spares
    # group_by_length a pass over every sample to measure it.
    args = training_arguments(spec, tuned_args | run_only, workdir, rank)
    # One device on a GPU: built there, its random init run by the GPU, and nothing copied
    # (bert-large built in 6.6 s on two host cores here, then copied). On ranks the
    # strategy places the model (FSDP2 shards it from the host, DeepSpeed's engine moves it;
    # tensor parallelism builds each rank's share on its device).
    where = "cuda" if spec.device == "cuda" and rank is None else "cpu"
    with clock.stage("model_build_s"):
        model = build_model(
            ModelSpec(name=spec.model_name, source="spec", config=spec.model_config),
            spec.task,
            device=where,
            quantization_config=knobs.quantization_config(spec.params),
            adapter=spec.adapter,
            tensor_parallel=rank.tensor_parallel if rank is not None else None,
            **model_kwargs,
        )
    with clock.stage("data_s"):
        dataset, collator = _data(spec, args, model, rank)
    with clock.stage("trainer_init_s"):
        return transformers.Trainer(
            model=model, args=args, train_dataset=dataset, data_collator=collator
        )


def _data(
    spec: TrialSpec,
    args: transformers.TrainingArguments,
    model: Any,
    rank: ranks.Rank | None,
) -> tuple[Any, Any]:
    """The training data and its collator (None: the Trainer's default)."""
    if spec.data_dir:
        import datasets

        dataset = datasets.load_from_disk(spec.data_dir)
        if spec.params.get("packing"):  # a batch's samples in one row, none padded
            prompted = rows.COMPLETION_MASK in dataset.column_names
            collator = (
                data.CompletionFlattening()
                if prompted
                else transformers.DataCollatorWithFlattening()
            )
        else:
            collator = data.PaddingCollator(
                task=spec.task,
                pad_token_id=read_ready(Path(spec.data_dir))["pad_token_id"],
                pad_to_multiple_of=knobs.value_of(spec.params, "pad_to_multiple_of"),
            )
    else:
        samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        # A distributed Trainer splits one dataset between the ranks; under sharding each rank
        # loads its own, other samples on each.
        shared = rank is not None and rank.trainer_distributed
        dataset = data.SyntheticDataset(
            task=spec.task,
            vocab_size=model.config.vocab_size,
            seq_len=spec.seq_len,
            n_samples=samples_per_step * args.max_steps * (rank.world_size if shared else 1),
            seed=spec.seed + (rank.rank if rank is not None and not shared else 0),
        )
        collator = None  # the Trainer's default: the samples are of one length
    return dataset, collator


def users_trainer(
    spec: TrialSpec,
    tuned_args: dict[str, Any],
    model_kwargs: dict[str, Any],
    workdir: str,
    rank: ranks.Rank | None = None,
) -> transformers.Trainer:
    """The Trainer the user's factory (`trainer=`) makes with the tuned arguments."""
    args = training_arguments(spec, tuned_args, workdir, rank)
    factory = factories.load(spec.trainer, spec.trainer_dir)
    # A copy taken before the call: the factory may change the very object it is given.
    expected = _set_by_autotune(args, spec, tuned_args)
    print(f"calling {spec.trainer}(args, model_kwargs={model_kwargs!r})", flush=True)
    trainer = factory(args, dict(model_kwargs))
    if not isinstance(trainer, transformers.Trainer):
        raise factories.FactoryError(
            f"{spec.trainer} returned {type(trainer).__name__}, not a transformers.Trainer"
        )
    check_trained_args(spec.trainer, expected, trainer.args)
    return trainer


def _set_by_autotune(
    args: transformers.TrainingArguments, spec: TrialSpec, tuned_args: dict[str, Any]
) -> dict[str, Any]:
    """The values of every argument autotune set (the tuned ones and the fixed run length),
    as TrainingArguments holds them after its own checks."""
    names = [*tuned_args, *_run_args(spec)]
    return {name: copy.deepcopy(getattr(args, name)) for name in names}


def check_trained_args(ref: str, expected: dict[str, Any], trained: Any) -> None:
    """Refuse a Trainer whose arguments differ from those autotune set: its trial would be
    recorded under settings that never ran."""
    changed = [
        f"{name}={getattr(trained, name, None)!r} (tuned: {value!r})"
        for name, value in expected.items()
        if getattr(trained, name, None) != value
    ]
    if changed:
        raise factories.FactoryError(
            f"{ref}: the Trainer trains with other arguments than the trial's: "
            f"{', '.join(changed)}. Pass `args` to the Trainer unchanged (Trainer(args=args, "
            "...)); settings of your own belong in the search space"
        )


def training_arguments(
    spec: TrialSpec, tuned_args: dict[str, Any], workdir: str, rank: ranks.Rank | None = None
) -> transformers.TrainingArguments:
    """The tuned arguments plus what every trial runs with: a fixed number of steps, no saving,
    logging, progress bars or trackers; on a rank that FSDP2 shards, its kind of them."""
    kind = (
        rank_training.ShardedArguments
        if rank is not None and rank.fsdp
        else transformers.TrainingArguments
    )
    try:
        return kind(output_dir=workdir, **_run_args(spec), **tuned_args)
    except (ValueError, ImportError) as exc:  # TrainingArguments validates combinations here
        raise InvalidConfig(f"TrainingArguments refused the settings: {exc}") from exc


def _run_args(spec: TrialSpec) -> dict[str, Any]:
    """What every trial runs with, beside the tuned arguments."""
    return {
        "max_steps": spec.warmup_steps + spec.measure_steps,
        "save_strategy": "no",
        "logging_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": spec.seed,
    }


ADAPTER_FIELDS = ("r", "lora_alpha", "lora_dropout", "target_modules", "task_type")
"""What of a `LoraConfig` autotune records, stores and exports: the job's adapter."""


def adapter_of(model: Any) -> dict[str, Any] | None:
    """The LoRA adapter a model (a factory's `PeftModel`) trains, as `LoraConfig` kwargs;
    None for a model without one. Sets come back sorted: a config as JSON is the same twice."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None
    config = next(iter(configs.values())).to_dict()
    kwargs = {k: config.get(k) for k in ADAPTER_FIELDS if config.get(k) is not None}
    if isinstance(kwargs.get("target_modules"), list | set | tuple):
        kwargs["target_modules"] = _target_names(model, set(kwargs["target_modules"]))
    if "task_type" in kwargs:
        kwargs["task_type"] = str(getattr(kwargs["task_type"], "value", kwargs["task_type"]))
    return kwargs


def _target_names(model: Any, targets: set[str]) -> list[str]:
    """`target_modules` as short as they target the same modules: peft writes `all-linear`
    out as every module's path (`model.layers.0.mlp.up_proj`, ...), which the module names
    alone (`up_proj`) target too, where no other module has those names."""
    leaves = {t.rsplit(".", 1)[-1] for t in targets}
    named = {n for n, _ in _base(model).named_modules() if n.rsplit(".", 1)[-1] in leaves}
    return sorted(leaves if named == targets else targets)


def _base(model: Any) -> Any:
    """The model under a `PeftModel`; a model that carries adapters itself (transformers'
    `add_adapter`, which gives it a `peft_config` too) is its own base."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def factory_model(model: Any) -> dict[str, Any]:
    """What a factory's model is, for the estimate of later trials: its config (the base's,
    under an adapter) as JSON gives it, and its task."""
    base = _base(model)
    config = json.loads(base.config.to_json_string(use_diff=False))
    # The weights' own dtype, not the config's: a factory may build or cast them otherwise
    # (the first floating one: a quantized weight packs ints).
    dtype = next((p.dtype for p in base.parameters() if p.is_floating_point()), None)
    if dtype is not None:
        config["dtype"] = str(dtype).removeprefix("torch.")
    return {"trained_config": config, "trained_task": task_of_class(type(base).__name__)}


def compiled_modules(trainer: transformers.Trainer) -> int:
    """The modules torch.compile wrapped in what the Trainer trained (whole or regional)."""
    return sum(type(m).__name__ == "OptimizedModule" for m in trainer.model_wrapped.modules())
