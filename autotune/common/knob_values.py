"""The values knobs take (precisions, attention kernels, strategies, optimizers) and facts about
them that several stages ask. Shared by both sides: imports neither optuna nor torch."""

from __future__ import annotations

from typing import Any

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp16+tf32", "bf16+tf32", "fp8")
"""`fp8`: accelerate's fp8 training (torchao's Float8Linear for the linear layers' matmuls,
bf16 autocast for the rest), set through its environment: GPUs of compute capability 8.9+."""


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")


FLASH_ATTENTION = frozenset({"flash_attention_2", "flash_attention_3"})
"""The `flash-attn` package's kernels (FlashAttention 2; 3 on Hopper): CUDA, fp16/bf16."""


STRATEGIES = (
    "single", "ddp", "dp", "fsdp", "fsdp_grad_op", "fsdp_offload", "zero1", "zero2", "zero3",
    "zero2_offload", "zero3_offload", "tp", "pp",
)  # fmt: skip
"""How a trial's ranks share the training (`devices_per_trial`): `single` is one device;
`ddp` replicates the model and averages gradients (what torchrun + the HF defaults do);
`dp` is one process driving every GPU of the trial through `torch.nn.DataParallel` (the
Trainer's own, when one process sees several GPUs): each step it scatters the batch from GPU
0, copies the model to the others, gathers their outputs back and sums their gradients onto
GPU 0, where the optimizer steps; CUDA only, and its GPU 0 holds the most;
`fsdp` shards parameters, gradients and optimizer states across the ranks (FSDP2
`fully_shard`), gathering each block's parameters for its forward and backward;
`fsdp_grad_op` keeps the gathered parameters from the forward to the backward (one gather
fewer a step, more memory: ZeRO-2-like); `fsdp_offload` is `fsdp` with every shard (weights,
gradients, optimizer states) in host memory and the optimizer stepping there (FSDP2's
`CPUOffloadPolicy`): the device holds only the blocks that compute. `zero1`/`zero2`/`zero3`
are DeepSpeed's ZeRO stages (optimizer states; and gradients; and parameters sharded),
`zero2_offload`/`zero3_offload` the same with the optimizer (and ZeRO-3's parameters) kept in
host memory. `tp` (tensor parallelism) splits each block's linear layers across the ranks
by the model's tensor-parallel plan (`tp_size` ranks a group, all of the trial's unless set;
the groups, if several, shard the rest as FSDP2 does): each rank holds its share of every
weight, gradient and optimizer state, and the ranks all-reduce each block's activations twice
in its forward and twice in its backward; the Trainer trains it through accelerate's
`ParallelismConfig`, on CUDA only (`TENSOR_PARALLEL_ON_CPU`). `pp` (pipeline parallelism:
consecutive layers on consecutive ranks) is named so that a space asking for it is told why it
cannot run (`PIPELINE_REFUSAL`); it is never searched unnamed."""


PIPELINE_REFUSAL = (
    "no Trainer path trains a pipeline in the versions autotune supports: TrainingArguments "
    "has no pipeline setting, accelerate's ParallelismConfig splits data, tensors, context and "
    "sequences but not layers, and transformers' DistributedConfig(pp_size=) splits the model "
    "but its forward returns no loss to train on (docs/devices.md#pipeline-parallelism); "
    "fsdp, zero3 and their offloads shard a model too big for one GPU instead"
)
"""Why `strategy=pp` leaves a space; `tests/integration/test_pipeline.py` holds its clauses
against the installed packages and fails the day one stops being true."""


TENSOR_PARALLEL_ON_CPU = (
    "the Trainer trains a tensor-parallel model through accelerate's ParallelismConfig, which "
    "refuses DistributedType.MULTI_CPU (it takes FSDP2, multi-GPU and DeepSpeed runs); "
    "on CPU the sharded load and its losses are tested by tests/integration/test_tensor_parallel.py"
)
"""Why `strategy=tp` leaves a space on CPU; the test named holds the refusal against the
installed accelerate."""


FSDP = frozenset({"fsdp", "fsdp_grad_op", "fsdp_offload"})
"""Strategies applied by FSDP2's `fully_shard`."""


ZERO_STAGES = {"zero1": 1, "zero2": 2, "zero3": 3, "zero2_offload": 2, "zero3_offload": 3}
"""DeepSpeed's strategies and their ZeRO stage (DeepSpeed is an optional extra)."""


OFFLOADED = frozenset({"fsdp_offload", "zero2_offload", "zero3_offload"})
"""Strategies that keep model states in host memory: for a GPU that cannot hold them."""


SHARDED = FSDP | {"zero3", "zero3_offload", "tp"}
"""Strategies under which each rank holds a share of the parameters: 1/N of them under full
sharding, its split of the layers (and the rest whole) under tensor parallelism."""


MEMORY_ORDER = (
    "ddp", "zero1", "zero2", "tp", "pp", "fsdp_grad_op", "fsdp", "zero3", "zero2_offload",
    "fsdp_offload", "zero3_offload",
)  # fmt: skip
"""The strategies on several devices from the most model states a rank holds in device memory
to the least: DDP all of them; ZeRO-1 the optimizer's share; ZeRO-2 the gradients' too; tensor
parallelism over every device 1/N of the split layers' states and all of the rest (the norms,
an untied input embedding); a pipeline's last stage its 1/N of the blocks and the LM head
(estimated only: `PIPELINE_REFUSAL`); full sharding (FSDP's two modes, ZeRO-3) 1/N of all of them;
offload moves them to the host. At the peak FSDP's grad-op mode also holds every block's
gathered weights, from forward to backward; FSDP's offload gathers its blocks in fp32, ZeRO-3's
in the training precision."""


BNB_OPTIMIZERS = frozenset({
    "adamw_bnb_8bit", "adamw_8bit", "ademamix", "ademamix_8bit", "lion_8bit", "lion_32bit",
    "paged_adamw_32bit", "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "paged_lion_32bit", "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
})  # fmt: skip
"""TrainingArguments.optim values backed by bitsandbytes: their kernels update tensors on a
GPU."""


TORCHAO_OPTIMIZERS = frozenset({"adamw_torch_8bit", "adamw_torch_4bit"})
"""TrainingArguments.optim values backed by torchao's low-bit AdamW (an optional extra): its
states quantised to 8 or 4 bits, on CPU and GPU."""


UNSHARDABLE_OPTIMIZERS = frozenset({"adafactor"})
"""Optimizers whose update cannot run on FSDP2's sharded parameters (DTensors): transformers'
Adafactor mixes them with plain tensors ("got mixed torch.Tensor and DTensor")."""


def deepspeed_config(strategy: str, overlap_comm: bool | None = None) -> dict[str, Any]:
    """The DeepSpeed config of a ZeRO strategy, as the Trainer takes it (`deepspeed=`): the
    batch, accumulation, clipping and precision follow the TrainingArguments ("auto");
    `overlap_comm` (the `zero_overlap_comm` knob; None: DeepSpeed's default, on for ZeRO-3
    only) overlaps the gradients' reduction with the backward."""
    zero: dict[str, Any] = {"stage": ZERO_STAGES[strategy]}
    if overlap_comm is not None:
        zero["overlap_comm"] = overlap_comm
    if ZERO_STAGES[strategy] == 3:  # the sizes HF's ZeRO-3 example derives from the model
        zero |= {
            "stage3_param_persistence_threshold": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "reduce_bucket_size": "auto",
        }
    optimizer = {}
    if strategy in OFFLOADED:  # DeepSpeed's own AdamW, which it runs on the host (CPU Adam)
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        optimizer["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    if strategy == "zero3_offload":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return optimizer | {
        "zero_optimization": zero,
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "fp16": {"enabled": "auto"},
        "bf16": {"enabled": "auto"},
    }


TRANSFORMERS_DEFAULT_OPTIM = "adamw_torch_fused"
"""transformers 5's `TrainingArguments().optim`: stands only where the probe did not read the
installed one (a `DeviceInfo` made by hand, a software cache without it)."""


def precision_parts(precision: str) -> set[str]:
    """`bf16+tf32` -> {"bf16", "tf32"}."""
    return set(precision.split("+"))


def sixteen_bit(precision: str | None) -> bool:
    """Mixed precision with 16-bit matmuls (fp16 or bf16 autocast); fp8 counts too (its
    activations and the matmuls outside the linear layers are bf16)."""
    return precision is not None and bool({"fp16", "bf16", "fp8"} & precision_parts(precision))


FP8_ENVIRONMENT = {"ACCELERATE_MIXED_PRECISION": "fp8", "ACCELERATE_FP8_BACKEND": "AO"}
"""accelerate's fp8 training on torchao's Float8Linear: TrainingArguments has no fp8 field and
takes the mixed precision from this environment when fp16 and bf16 are off."""


def optimizer_family(optim: str) -> str:
    """`adamw_torch_fused` -> `AdamW`, `adamw_bnb_8bit` -> `AdamW (8-bit states)`: the update
    rule and the precision of its states, which kernels (torch, fused, apex) do not change."""
    name = optim.lower()
    rule = next(
        (rule for key, rule in _OPTIMIZER_RULES if key in name),
        "AdamW" if "adam" in name else optim,
    )
    bits = next((f" ({b}-bit states)" for b in ("8", "4") if f"{b}bit" in name), "")
    return rule + bits


# Checked in order: `ademamix` and `lion` before `adam`; names from TrainingArguments.optim.
_OPTIMIZER_RULES = (
    ("adafactor", "Adafactor"), ("ademamix", "AdEMAMix"), ("lion", "Lion"), ("lomo", "LOMO"),
    ("galore", "GaLore"), ("apollo", "APOLLO"), ("schedule_free", "schedule-free"),
    ("grokadamw", "GrokAdamW"), ("rmsprop", "RMSprop"), ("sgd", "SGD"), ("adagrad", "Adagrad"),
)  # fmt: skip
