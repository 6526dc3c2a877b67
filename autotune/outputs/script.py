"""recommended.py: a trial's settings as a script that trains with them, building the model,
the data and the Trainer as its trial did (`render_script` says how the study's names stay out
of its code). The script's text is here whole: its fixed head and body, and the collator's
source, read from the file the trials ran it from.
"""

from __future__ import annotations

import ast
import pprint
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.common.errors import StudyError
from autotune.common.knobs import KNOBS, value_of
from autotune.common.models import TASK_CLASSES
from autotune.outputs.launch import launch_command, strategy

if TYPE_CHECKING:  # types only: rendering a script reads no storage (records imports optuna)
    from autotune.plan.run_info import RunInfo
    from autotune.store.records import TrialRecord


def render_script(info: RunInfo, record: TrialRecord, *, report_to: str | None = None) -> str:
    """A runnable script: the model from its config, random tokens or the study's data, a
    Trainer with the args; or the study's Trainer factory called with them.

    The script's code is fixed text. Everything that comes from the study (model name or path,
    study and device names, the config, the kwargs) goes into constants written as Python
    literals, never into code or the docstring: a model folder may be named like code that
    closes a docstring and calls `os.system`. `report_to` (default: the study's) names the
    experiment trackers the script's run logs to.
    """
    metrics = record.result
    if info.task not in TASK_CLASSES:  # a study.db from elsewhere may hold anything
        raise StudyError(f"task {info.task!r}: not a task autotune trains; cannot write a script")
    data = None
    data_format, data_files = "", []
    if info.data:
        data = {k: info.data[k] for k in ("data", "split", "text_column", "tokenizer")}
        data_format, data_files = info.data["format"], info.data["files"]
    collator = {k: v for k, v in record.params.items() if KNOBS[k].collator}
    facts = {
        "MODEL": info.model,
        "STUDY": info.study,
        "TRIAL": record.number,
        "DEVICE_NAME": info.device_name,
        "SIMULATED": info.simulated,
        "SAMPLES_PER_S": metrics.samples_per_s,
        "PEAK_MEMORY_GIB": metrics.peak_memory_gib,
        "TASK": info.task,
        "AUTO_CLASS_NAME": TASK_CLASSES[info.task][0],
        "SEQ_LEN": info.seq_len,
        "MODEL_CONFIG": info.model_config,
        "TRAINING_ARGS": metrics.training_args,
        "MODEL_KWARGS": metrics.model_kwargs,
        "PEFT_CONFIG": metrics.peft_config,
        "QUANTIZATION_CONFIG": metrics.quantization_config,
        "ENVIRONMENT": metrics.environment,
        "REPORT_TO": (report_to or info.report_to).split(","),
        "DATA": data,
        "DATA_FORMAT": data_format,
        "DATA_FILES": data_files,
        "COLLATOR_KWARGS": collator,
        "TRAINER": info.trainer,
        "DEVICES": info.devices_per_trial or 1,
        "STRATEGY": strategy(info, record.params),
        "TP_SIZE": value_of(record.params, "tp_size", devices=info.devices_per_trial or 1),
        "FSDP_PREFETCH": bool(value_of(record.params, "fsdp_prefetch")),
        "DDP_GRADIENT_AS_BUCKET_VIEW": bool(value_of(record.params, "gradient_as_bucket_view")),
        "LAUNCH": launch_command(info, record.params),
    }
    constants = "".join(f"{name} = {_literal(name, value)}\n" for name, value in facts.items())
    return _SCRIPT_HEAD + constants + _SCRIPT_BODY.replace(_COLLATOR_SLOT, _collator_source())


_COLLATOR_SLOT = "# (autotune's PaddingCollator)\n"
COPIED = {
    "data.py": ("IGNORE_INDEX", "PaddingCollator", "CompletionFlattening"),
    "rows.py": ("TOKENS", "DEFAULT_TEXT_COLUMN", "COMPLETION_MASK", "turn_columns", "layout_of",
                "encode"),
}  # fmt: skip
"""What of `autotune.child` the script holds a copy of: the collators the trials batched with,
and how their rows became tokens."""


def _collator_source() -> str:
    """The source of `COPIED`, read from the files the trials ran it from: this module is
    imported where torch is not."""
    pieces = []
    for file, names in COPIED.items():
        path = Path(str(resources.files("autotune.child") / file))
        source = path.read_text(encoding="utf-8")
        for node in ast.parse(source).body:
            assigned = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            assigned += [e.id for t in getattr(node, "targets", []) for e in getattr(t, "elts", [])]
            if getattr(node, "name", None) in names or set(assigned) & set(names):
                pieces.append(ast.get_source_segment(source, node))
    return "\n\n".join(pieces) + "\n"


def _literal(name: str, value: Any) -> str:
    """`value` as a Python literal, checked to evaluate back to `value` itself."""
    source = pprint.pformat(value, indent=4, sort_dicts=False)
    try:
        same = ast.literal_eval(source) == value
    except (ValueError, SyntaxError):  # e.g. `nan`, `inf`: names, not literals
        same = False
    if not same:
        raise StudyError(
            f"{name} = {value!r}: the script cannot hold this as a Python literal (NaN and "
            "Infinity have none); fix the value at its source (for MODEL_CONFIG the model's "
            "config.json), or export format=json instead"
        )
    return source


_SCRIPT_HEAD = '''"""Train a model with the TrainingArguments autotune measured for it.

    python recommended.py [--max-steps N] [--output-dir DIR] [--report-to NAME ...]

or, where the trial trained on several devices (DEVICES), under the command in LAUNCH. The
constants below say which model, trial and device (SIMULATED, where set, the GPU twin that
answered the study's trials: then no figure here was measured); --help says it in words. As
the search did, the script builds the model from its config with random weights and trains on random
tokens, or on your data (DATA: tokenized, truncated at SEQ_LEN and padded per batch by the
collator the trials used), or calls your Trainer factory (TRAINER) with the arguments. For your
own run with autotune's Trainer, load pretrained weights with AUTO_CLASS.from_pretrained(MODEL,
**MODEL_KWARGS), with quantization_config=transformers.BitsAndBytesConfig(**QUANTIZATION_CONFIG)
where the trial's base was quantized, and wrap it in the adapter the trial trained,
peft.get_peft_model(model, peft.LoraConfig(**PEFT_CONFIG)), where it trained one.
"""

import argparse
import importlib
import importlib.util
import math
import os
import pathlib
import sys
from typing import Any

import torch
import transformers

'''

_SCRIPT_BODY = """AUTO_CLASS = getattr(transformers, AUTO_CLASS_NAME)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, vocab_size, n_samples):
        self.input_ids = torch.randint(vocab_size, (n_samples, SEQ_LEN))
        if TASK == "sequence-classification":
            self.labels = torch.randint(2, (n_samples,))
        elif TASK == "seq2seq":
            self.labels = torch.randint(vocab_size, (n_samples, SEQ_LEN))
        else:
            self.labels = self.input_ids

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "labels": self.labels[i]}


def description():
    # argparse %-formats the description, so a % in a name is doubled. The lines are ours
    # (raw formatter): wrapping would break a model path at its hyphens.
    model, study, device, task = (s.replace("%", "%%") for s in (MODEL, STUDY, DEVICE_NAME, TASK))
    measured = "measured"
    if SIMULATED:  # no figure of the study was measured: the twin answered its trials
        measured = "simulated by " + SIMULATED.replace("%", "%%") + ", not measured:"
    return (
        f"%(prog)s trains {model}\\n"
        f"({task}, seq_len {SEQ_LEN}) with the TrainingArguments of trial {TRIAL} of study "
        f"{study}\\non {device}, {measured} {SAMPLES_PER_S:.2f} samples/s, "
        f"{PEAK_MEMORY_GIB:.2f} GiB peak."
    )


# (autotune's PaddingCollator)


def your_data():
    # DATA tokenized as the trials had it, and the collator they padded batches with.
    import datasets

    tokenizer = transformers.AutoTokenizer.from_pretrained(DATA["tokenizer"])
    if DATA_FORMAT == "save_to_disk":
        dataset = datasets.load_from_disk(DATA["data"])
    elif DATA_FORMAT == "hub":
        dataset = datasets.load_dataset(DATA["data"])
    else:
        dataset = datasets.load_dataset(DATA_FORMAT, data_files=DATA_FILES)
    if isinstance(dataset, datasets.DatasetDict):
        dataset = dataset[DATA["split"]]
    layout, column = layout_of(
        dataset.column_names, DATA["text_column"], turn_columns(dataset.data.schema)
    )
    if layout == TOKENS:
        kept = [c for c in dataset.column_names if c in ("input_ids", "label", "labels")]
        dataset = dataset.select_columns(kept).map(
            lambda row: {"input_ids": row["input_ids"][:SEQ_LEN]}
        )
    else:  # text, chat turns (the tokenizer's chat template), or prompts and completions
        dropped = [c for c in dataset.column_names if c not in ("label", "labels")]
        dataset = dataset.map(
            lambda batch: encode(batch, layout=layout, column=column, tokenizer=tokenizer,
                                 seq_len=SEQ_LEN),
            batched=True, remove_columns=dropped,
        )
    # group_by_length reads the lengths from this column instead of measuring every sample.
    dataset = dataset.map(lambda row: {"length": len(row["input_ids"])})
    pad_token_id = next(
        (t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0
    )
    if COLLATOR_KWARGS.get("packing"):  # a batch's samples in one row (FlashAttention)
        if COMPLETION_MASK in dataset.column_names:  # the prompts' tokens not trained on
            return dataset, CompletionFlattening()
        return dataset, transformers.DataCollatorWithFlattening()
    padding = {k: v for k, v in COLLATOR_KWARGS.items() if k != "packing"}
    return dataset, PaddingCollator(task=TASK, pad_token_id=pad_token_id, **padding)


def your_trainer():
    # The factory TRAINER names, imported as the search imported it.
    where, _, function = TRAINER["factory"].rpartition(":")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(pathlib.Path(where).stem, where)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        sys.path.insert(0, TRAINER["search_dir"])
        module = importlib.import_module(where)
    return getattr(module, function)


def join_the_ranks():
    # FSDP2 as the trials ran it: this process joins the group the launcher set up and shards
    # the model itself, and the Trainer stays undistributed (its own FSDP path trains plain
    # DDP on CPU). On GPUs the undistributed Trainer trains on cuda:0: this rank's own device
    # is listed first, before CUDA starts, the others still visible for NCCL's copies between
    # them. Offloaded, the host's shards are reduced over gloo. Returns (this rank, the ranks).
    import torch.distributed as dist

    rank, world = int(os.environ.pop("RANK")), int(os.environ.pop("WORLD_SIZE"))
    local = int(os.environ.pop("LOCAL_RANK"))
    local_world = int(os.environ.pop("LOCAL_WORLD_SIZE", world))
    backend = "gloo"
    if not TRAINING_ARGS.get("use_cpu"):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        if visible == [""]:
            visible = [str(i) for i in range(local_world)]
        own = visible[local]
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join([own] + [v for v in visible if v != own])
        torch.cuda.set_device(0)
        backend = "cpu:gloo,cuda:nccl" if STRATEGY == "fsdp_offload" else "nccl"
    dist.init_process_group(backend, rank=rank, world_size=world)
    return rank, world


class ShardedArguments(transformers.TrainingArguments):
    # The model stays on the host until fully_shard moves each block's shard to this rank's
    # device (offloaded, the shards stay on the host), and the Trainer trains on that one
    # device, never DataParallel over the others.
    @property
    def place_model_on_device(self):
        return False

    @property
    def n_gpu(self):
        return 0 if self.use_cpu else 1


def shard(model):
    # fully_shard on each transformer block (the model's _no_split_modules), then the model;
    # with FSDP_PREFETCH each block prefetches the next one's parameters in its forward and
    # the previous one's in its backward; fsdp_offload keeps every shard in host memory.
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in list(model.modules())[1:] if type(m).__name__ in names]
    reshard = STRATEGY != "fsdp_grad_op"
    offload = {"offload_policy": CPUOffloadPolicy()} if STRATEGY == "fsdp_offload" else {}
    for block in blocks:
        fully_shard(block, reshard_after_forward=reshard, **offload)
    fully_shard(model, reshard_after_forward=reshard, **offload)
    if FSDP_PREFETCH:
        for before, after in zip(blocks, blocks[1:]):
            before.set_modules_to_forward_prefetch([after])
            after.set_modules_to_backward_prefetch([before])


def set_ddp(trainer):
    # DDP's settings that TrainingArguments has no field for, set on the Trainer's accelerator
    # before it wraps the model: DDP_GRADIENT_AS_BUCKET_VIEW makes the gradients views into
    # DDP's buckets instead of a second copy.
    if DDP_GRADIENT_AS_BUCKET_VIEW:
        trainer.accelerator.ddp_handler.gradient_as_bucket_view = True


def save_sharded(model, output_dir, rank):
    # The Trainer's own checkpoints cannot hold a model it did not shard: the full weights,
    # gathered from every rank, are saved by rank 0 at the end instead.
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state_dict = get_model_state_dict(model, options=options)
    if rank == 0:
        model.save_pretrained(output_dir, state_dict=state_dict)


def build_model(config):
    # As the trial built it: random weights in MODEL_KWARGS's dtype; a quantized base made on
    # the host and quantized by from_pretrained as it places each weight, as a checkpoint
    # would be; the adapter by peft, the base frozen.
    if STRATEGY == "tp":
        # Split by the model's tensor-parallel plan over groups of TP_SIZE ranks (the groups
        # shard the rest), each rank building its share: from_pretrained with no checkpoint.
        # The Trainer then trains it through accelerate's ParallelismConfig.
        from transformers.distributed import DistributedConfig

        groups = int(os.environ["WORLD_SIZE"]) // TP_SIZE
        return AUTO_CLASS._model_mapping[type(config)].from_pretrained(
            None, config=config, state_dict={},
            distributed_config=DistributedConfig(tp_size=TP_SIZE, fsdp_size=groups),
            **MODEL_KWARGS,
        )
    if QUANTIZATION_CONFIG:
        made = AUTO_CLASS.from_config(config, **MODEL_KWARGS)
        model = AUTO_CLASS._model_mapping[type(config)].from_pretrained(
            None, config=config, state_dict=made.state_dict(),
            quantization_config=transformers.BitsAndBytesConfig(**QUANTIZATION_CONFIG),
            device_map={"": "cpu" if TRAINING_ARGS.get("use_cpu") else "cuda"}, **MODEL_KWARGS,
        )
        del made
    else:
        model = AUTO_CLASS.from_config(config, **MODEL_KWARGS)
    if PEFT_CONFIG:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(**PEFT_CONFIG))
    return model


def main():
    parser = argparse.ArgumentParser(
        description=description(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--output-dir", default="output")
    parser.add_argument(
        "--report-to", nargs="+", default=REPORT_TO, metavar="NAME",
        help="experiment trackers to log to (TrainingArguments.report_to) [%(default)s]",
    )
    cli = parser.parse_args()
    # torch.compile's modes as the trial set them (accelerate reads them from the environment).
    os.environ.update(ENVIRONMENT)
    if STRATEGY not in ("single", "dp") and "RANK" not in os.environ:
        sys.exit(f"trial {TRIAL} trained on {DEVICES} devices under {STRATEGY}: run {LAUNCH}")
    if STRATEGY == "dp" and torch.cuda.device_count() != DEVICES:  # the Trainer takes them all
        sys.exit(
            f"trial {TRIAL} trained on {DEVICES} GPUs under DataParallel, and this process "
            f"sees {torch.cuda.device_count()}: run {LAUNCH}"
        )
    sharded = STRATEGY in ("fsdp", "fsdp_grad_op", "fsdp_offload")
    rank, world = join_the_ranks() if sharded else (0, 1)
    # autotune's collator reads the columns it needs; the others (length) stay for the sampler.
    data_args = {"remove_unused_columns": False} if DATA else {}
    saving = {"save_strategy": "no"} if sharded else {}  # see save_sharded
    arguments = ShardedArguments if sharded else transformers.TrainingArguments
    args = arguments(
        output_dir=cli.output_dir, max_steps=cli.max_steps, report_to=cli.report_to,
        **TRAINING_ARGS, **data_args, **saving,
    )
    if "deepspeed" in TRAINING_ARGS:
        # DeepSpeed's communication on the launcher's ranks before the model is built: under
        # ZeRO-3 the model is partitioned as it is made, which asks DeepSpeed for the ranks.
        import deepspeed

        deepspeed.init_distributed()
    if TRAINER:
        trainer = your_trainer()(args, dict(MODEL_KWARGS))
        if sharded:
            shard(trainer.model)
        set_ddp(trainer)
        trainer.train()
        if sharded:
            save_sharded(trainer.model, cli.output_dir, rank)
        return
    config = transformers.AutoConfig.for_model(**MODEL_CONFIG)
    if TASK == "sequence-classification" and config.pad_token_id is None:
        config.pad_token_id = config.eos_token_id
    model = build_model(config)
    if sharded:
        shard(model)
    if DATA:
        dataset, collator = your_data()
    else:
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        dataset, collator = RandomTokens(config.vocab_size, samples * cli.max_steps * world), None
    if sharded:  # the undistributed Trainer splits nothing: each rank takes its share here
        dataset = torch.utils.data.Subset(dataset, range(rank, len(dataset), world))
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=dataset, data_collator=collator
    )
    set_ddp(trainer)
    trainer.train()
    if sharded:
        save_sharded(model, cli.output_dir, rank)


def leave_the_ranks():
    # Every rank done, then the process group ended while Python is whole: a rank that exits
    # with a gloo group alive can abort (SIGABRT) in the interpreter's teardown, as gloo's
    # threads let go of the tensors they still hold.
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    leave_the_ranks()
"""
