"""Peak training memory and FLOPs before any trial runs, by the HF guide's anatomy.

Parent side and pure: a model's config (a dict), the task, seq_len and the knobs in; bytes per
part out. No torch: `autotune estimate` answers in well under a second, and the search asks it
before every trial.

The parts, per parameter P and per micro-batch of b samples of s tokens:
- weights: 4 B/param in fp32; mixed precision adds the 16-bit copies autocast keeps (2 B);
- gradients: 4 B/param (the weights are fp32);
- optimizer states: AdamW 8 B/param, 8-bit AdamW 2, Lion/RMSprop/Adagrad 4, SGD 0, Adafactor
  its factored second moments (a row and a column per matrix);
- activations, per layer (Korthikanti et al. 2022, "Reducing activation recomputation", whose
  34sbh + 5as^2b is the 16-bit case), written per tensor autograd keeps: the inputs of the
  matmuls, Q, K and V, the MLP's two intermediates, the LayerNorm inputs (fp32 residual
  stream), dropout masks (1 B), and with eager attention the softmax output, its dropout mask
  and the dropped-out copy (a^2 s^2 b terms; SDPA's fused kernels on CUDA keep none); with
  checkpointing only each layer's input plus one layer recomputed; plus the LM head's logits;
- under `torch.compile` on CUDA, the activations times COMPILED_ACTIVATIONS_FACTOR (measured
  once, on an H100);
- temporary: one layer's activation gradients during backward, and the LM head's logits grad;
- the CUDA context (kernels, cuBLAS workspace) on CUDA; on CPU, the runtime's own memory.

`Estimate.total` is the whole process, what the device must hold; `Estimate.budgeted` is the part
a trial's measured peak counts and its memory budget caps: on CUDA all but the context, which
PyTorch's allocator does not hold (see `Estimate.budgeted`).

On several devices a trial (`devices`), the weights, gradients and optimizer states are one
rank's, by the strategy that shares them: `autotune.plan.model_states` gives each one's
accounting.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

from autotune.common.flops import training_flops
from autotune.common.knob_values import optimizer_family, sixteen_bit
from autotune.common.knobs import is_compiled, value_of
from autotune.common.units import GIB
from autotune.plan.linears import DECODER_LINEARS, block_linears, targeted
from autotune.plan.model_states import adapter_states, rank_states

CUDA_CONTEXT_BYTES = int(0.75 * GIB)
"""The CUDA context of a training process (the runtime, the loaded kernels, the cuBLAS and cuDNN
handles): NVML's per-process figure minus what PyTorch's allocator reserved, not seen by
torch.cuda.memory_stats and not under the allocator's cap. Measured 0.72 GiB by autotune's own
baseline trials (bert-large, torch 2.11 + CUDA 13.0) on an H100 (11.02 - 10.30 GiB) and an H200
(12.26 - 11.53); a process that only initialises CUDA (the probe) holds 0.52."""
COMPILED_ACTIVATIONS_FACTOR = 2.0
"""What `torch.compile` multiplies the activations by, on CUDA: the AOT-compiled graph saves
other tensors for backward than eager autograd does (more, measured). Measured once, in a plain
loop (no Trainer) on an H100, torch 2.11, inductor's default mode: bert-large, seq 512, bf16
autocast, batch 64, fused AdamW, SDPA, peaked at 63.4 GiB allocated compiled and 36.65 eager.
This estimate gives that setting 28.5 GiB of activations and 5.56 besides them (weights 1.87,
optimizer 2.5, temporary 1.19; the gradients, 1.25, fill in as activations are freed): 34.06 GiB
eager, 7% under the measured 36.65. (63.4 - 5.56) / 28.5 = 2.03, taken as 2.0: the compiled
setting is then estimated at 62.6 GiB. One model, one mode, one point: CPU compiles are left
as eager (not measured), and a study's own compiled trials correct both (`calibrated_gib`)."""
CPU_RUNTIME_BYTES = int(0.125 * GIB)
"""On CPU, what a training process's resident memory grows by beyond its tensors once steps
run (the allocator's free lists and arenas, oneDNN and OpenMP scratch, the Trainer's state):
the offset of the measured peaks over the tensors on the recorded landscapes
(`benchmarks/landscapes/`), 0.05-0.3 GiB there; 0.125 gives the three the smallest worst
median error."""
MASK_BYTES = 1
"""A dropout mask element (torch.bool)."""

PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "temporary", "context")


class UnknownShape(ValueError):
    """A config without the dimensions the estimate needs."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Shape:
    """What the memory of a transformer depends on, read from its config."""

    hidden: int
    layers: int
    """Transformer blocks (encoder plus decoder)."""
    heads: int
    intermediate: int
    vocab: int
    parameters: int
    matrices: tuple[tuple[int, int], ...]
    """The weight matrices' shapes, one entry per kind with its count folded in (Adafactor)."""
    dropout: bool
    cross_attention_layers: int = 0
    block_linear: int = 0
    """The weights of one block's linear layers: what a quantized base quantizes."""
    largest_linear: int = 0
    """The largest of them: a quantized base dequantizes one at a time to multiply by it."""
    adapter_parameters: int | None = None
    """The adapter's parameters (`peft=lora`), which alone train; None: every parameter."""
    adapter_matrices: tuple[tuple[int, int], ...] = ()
    """The adapter's matrices (A: r x in, B: out x r), one entry per kind, counts folded in."""
    adapter_inputs: int = 0
    """The input features of one block's adapted layers: LoRA keeps each input (its dropout's
    output, with a mask, when it drops out)."""
    adapter_dropout: bool = False

    @property
    def trained(self) -> int:
        """The parameters that get gradients and optimizer states."""
        return self.parameters if self.adapter_parameters is None else self.adapter_parameters

    @property
    def tensor_parallel_split(self) -> int:
        """The parameters a tensor-parallel plan splits: the blocks' linear layers and the LM
        head (Llama's, Qwen2's plans); the rest (norms, an untied input embedding) whole."""
        return min(self.layers * self.block_linear + self.vocab * self.hidden, self.parameters)

    def tensor_parallel_share(self, t: int) -> int:
        """A rank's parameters with the model split `t` ways: 1/t of the split, all the rest."""
        split = self.tensor_parallel_split
        return split // t + self.parameters - split


def shape_of(
    config: dict[str, Any], parameters: int | None = None, adapter: dict[str, Any] | None = None
) -> Shape:
    """The config's dimensions (BERT, GPT-2, T5, Llama names alike), its parameter count (the
    catalogue's when given, else counted from the dimensions) and, with `adapter` (peft's
    LoraConfig kwargs), the adapter's parameters on the linear layers it targets."""

    def first(*names: str, default: Any = None) -> Any:
        return next((config[n] for n in names if config.get(n) is not None), default)

    hidden = first("hidden_size", "n_embd", "d_model", "dim")
    encoder = first("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    if not all(isinstance(v, int) and v > 0 for v in (hidden, encoder)):
        raise UnknownShape(f"model_type {config.get('model_type')!r}: no hidden size or layers")
    decoder = 0
    if config.get("is_encoder_decoder"):
        decoder = first("num_decoder_layers", default=encoder)
    heads = first("num_attention_heads", "n_head", "num_heads", "n_heads", default=1)
    intermediate = first("intermediate_size", "n_inner", "d_ff", "ffn_dim", "hidden_dim")
    intermediate = intermediate or 4 * hidden
    vocab = first("vocab_size", default=0)
    gated = config.get("model_type") in ("llama", "mistral", "qwen2", "gemma", "qwen3")
    gated = gated or str(config.get("feed_forward_proj", "")).startswith("gated")
    layers = encoder + decoder
    mlp = (3 if gated else 2) * hidden * intermediate
    attention = 4 * hidden * hidden
    matrices = (
        (vocab, hidden),
        *[(hidden, hidden)] * 4 * (layers + decoder),  # decoder blocks cross-attend too
        *[(hidden, intermediate)] * (3 if gated else 2) * layers,
    )
    counted = vocab * hidden + layers * (attention + mlp) + decoder * attention
    linears = block_linears(config, hidden, intermediate, heads)
    if config.get("model_type") in DECODER_LINEARS:
        # Today's decoders: grouped K and V heads, a head of their own or tied to the
        # embeddings; counted layer by layer as transformers builds them (norms aside).
        matrices = ((vocab, hidden), *[(i, o) for _, i, o in linears] * layers)
        untied = not config.get("tie_word_embeddings", True)
        counted = vocab * hidden * (1 + untied) + layers * sum(i * o for _, i, o in linears)
    dropout = any(
        (config.get(k) or 0) > 0
        for k in (
            "hidden_dropout_prob",
            "attention_probs_dropout_prob",
            "resid_pdrop",
            "attn_pdrop",
            "dropout_rate",
            "dropout",
            "attention_dropout",
        )
    )
    lora: dict[str, Any] = {}
    if adapter is not None:
        targeted_linears = targeted(linears, adapter["target_modules"])
        r = adapter["r"]
        lora = {
            "adapter_parameters": layers * sum(r * (i + o) for _, i, o in targeted_linears),
            "adapter_matrices": tuple(
                m for _, i, o in targeted_linears for m in ((r, i), (o, r)) for _ in range(layers)
            ),
            "adapter_inputs": sum(i for _, i, _ in targeted_linears),
            "adapter_dropout": (adapter.get("lora_dropout") or 0) > 0,
        }
    return Shape(
        hidden=hidden,
        layers=layers,
        heads=heads,
        intermediate=intermediate,
        vocab=vocab,
        parameters=parameters or counted,
        matrices=matrices,
        dropout=dropout,
        cross_attention_layers=decoder,
        block_linear=sum(i * o for _, i, o in linears),
        largest_linear=max((i * o for _, i, o in linears), default=0),
        **lora,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """Bytes per part at the training peak, and the model FLOPs of one sample."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    """What autograd keeps for the backward in the blocks (the logits apart)."""
    logits: int
    """What a language-model head keeps: the logits, vocabulary x tokens, with their fp32 copy
    for the loss; a large share at long sequence and a 128k vocabulary."""
    temporary: int
    context: int
    total: int
    """The peak of the whole process, what the device must hold: not the plain sum, as
    gradients fill in while activations are freed."""
    budgeted: int
    """The part of `total` a trial's measured peak counts and its memory budget caps. On CUDA,
    `total` less the context: the worker caps PyTorch's allocator at the budget
    (`set_per_process_memory_fraction`) and measures `max_memory_reserved`, and neither sees
    the context, which the card holds besides. On CPU all of `total`: the peak measured there
    is the growth of the process's resident memory, its runtime's included."""
    flops_per_sample: float
    model_states: int
    """What a rank holds of the weights, their gradients and the optimizer's states (wherever:
    offloaded ones included): the strategy's formula (16 Psi under DDP, 16 Psi / N under full
    sharding, for AdamW)."""
    offloaded: int = 0
    """What of the model states a rank keeps in host memory (ZeRO-Offload, FSDP2's offload):
    not in `total`."""
    parameters: int = 0
    """The model's parameters."""
    trained_parameters: int = 0
    """The parameters that get gradients and optimizer states (an adapter's alone)."""


def optimizer_bytes_per_parameter(optim: str) -> float | None:
    """States per parameter; None for Adafactor (factored: see `_optimizer_states`)."""
    family = optimizer_family(optim)
    if family.startswith("Adafactor"):
        return None
    if "8-bit" in family:
        return 2.0 if family.startswith(("AdamW", "AdEMAMix")) else 1.0
    if "4-bit" in family:
        return 1.0
    if family.startswith(("SGD", "LOMO")):
        return 0.0
    if family.startswith(("Lion", "RMSprop", "Adagrad", "schedule-free")):
        return 4.0
    return 8.0  # AdamW and its kernels, AdEMAMix, GaLore/APOLLO at worst


KNOBS_READ = ("precision", "batch_size", "grad_accum", "optim", "attn_implementation",
              "gradient_checkpointing", "checkpointing_every_n_layers", "strategy",
              "torch_compile", "torch_dtype", "quantization")  # fmt: skip
"""The knobs `estimate` reads; the others leave it unchanged."""


def estimate(
    config: dict[str, Any],
    *,
    task: str,
    seq_len: int,
    params: dict[str, Any],
    device: str,
    parameters: int | None = None,
    context_bytes: int | None = None,
    gradients_kept: bool = False,
    devices: int = 1,
    adapter: dict[str, Any] | None = None,
) -> Estimate:
    """The peak of one training step with `params` (knob -> value; missing knobs at their HF
    default), on `device`. `context_bytes` replaces the CUDA context's size (CUDA_CONTEXT_BYTES);
    `gradients_kept` is for training loops that zero gradients in place instead of freeing them
    (`zero_grad(set_to_none=False)`, PyTorch's default before 2.0): they then live through
    every forward, as with gradient accumulation. On several `devices` a trial, the figures are
    one rank's, under `params["strategy"]` (under `dp`, GPU 0's: it holds every GPU's
    outputs). With `adapter` (peft's LoraConfig kwargs) the base is frozen: no gradients or
    optimizer states but the adapter's (`model_states.adapter_states`, the base in
    `torch_dtype`'s bytes or quantized)."""
    shape = shape_of(config, parameters, adapter)
    optimizer = _optimizer_states(shape, value_of(params, "optim"))
    if shape.adapter_parameters is None:
        head = shape.vocab * shape.hidden if task == "causal-lm" else 0
        split = shape.tensor_parallel_split
        states = rank_states(
            shape.parameters, shape.layers, optimizer, params, devices, split, head
        )
    else:  # an adapter's job: replicated on each rank, whatever the strategy
        quantized = shape.layers * shape.block_linear
        states = adapter_states(shape.parameters, shape.trained, quantized, optimizer, params)
    tp = value_of(params, "tp_size", devices=devices)  # 1 under any other strategy
    activations, logits, temporary = _activations(shape, task, seq_len, params, device, tp)
    strategy = value_of(params, "strategy", devices=devices)
    if devices > 1 and strategy == "dp":
        logits *= devices  # DataParallel gathers every GPU's outputs onto GPU 0, the peak's
    if devices > 1 and strategy == "pp":
        # GPipe: the last stage runs every micro-batch's forward before the first backward,
        # keeping its blocks' activations and its logits for each (`grad_accum` of them).
        in_flight = value_of(params, "grad_accum")
        stage = -(-shape.layers // devices)
        activations = activations * stage // max(shape.layers, 1) * in_flight
        logits *= in_flight
    # The peak: in the last backward, gradients fill in as activations are freed (one step:
    # the larger of the two); accumulating steps run every later forward with the gradients
    # of the earlier ones held.
    kept = value_of(params, "grad_accum") > 1 or gradients_kept
    gradients = states.gradients
    held = activations + logits
    live = gradients + held if kept else max(gradients, held)
    runtime = CUDA_CONTEXT_BYTES if device == "cuda" else CPU_RUNTIME_BYTES
    context = runtime if context_bytes is None else context_bytes
    total = states.weights + states.optimizer + live + states.buckets + temporary + context
    return Estimate(
        weights=states.weights,
        gradients=gradients + states.buckets,  # shown with the gradients, which they copy
        optimizer=states.optimizer,
        activations=activations,
        logits=logits,
        temporary=temporary,
        context=context,
        total=total,
        flops_per_sample=flops_per_sample(shape, seq_len, task),
        model_states=states.counted,
        offloaded=states.offloaded,
        budgeted=total - context if device == "cuda" else total,
        parameters=shape.parameters,
        trained_parameters=shape.trained,
    )


def _optimizer_states(shape: Shape, optim: str) -> int:
    """The optimizer's states for every parameter that trains, before a strategy shares them."""
    p = shape.trained
    matrices = shape.matrices if shape.adapter_parameters is None else shape.adapter_matrices
    per_param = optimizer_bytes_per_parameter(optim)
    if per_param is None:  # Adafactor: a row and a column of fp32 per matrix, the rest full
        factored = sum(r + c for r, c in matrices)
        in_matrices = sum(r * c for r, c in matrices)
        return 4 * (factored + max(0, p - in_matrices))
    return int(per_param * p)


def _activations(
    shape: Shape, task: str, seq_len: int, params: dict[str, Any], device: str, tp: int = 1
) -> tuple[int, int, int]:
    """(activations, logits, temporary): what autograd keeps for the backward in the blocks
    and at the LM head, and what the backward adds while it runs (one layer's activation
    gradients, the LM head's logits gradient, a quantized base's dequantized weight); with
    the blocks split `tp` ways, a rank's share (the head's logits are gathered whole)."""
    # 16-bit activations under autocast, or from a base whose weights are bf16.
    mixed = sixteen_bit(value_of(params, "precision")) or (
        value_of(params, "torch_dtype") == "bf16" and shape.adapter_parameters is not None
    )
    batch = value_of(params, "batch_size")
    attention = value_of(params, "attn_implementation")
    # On CPU, SDPA trains through PyTorch's math path (its fused kernel takes no dropout), which
    # keeps the scores as eager attention does; under bf16 autocast it computes in fp32.
    eager = attention == "eager" or device == "cpu"
    upcast = device == "cpu" and attention == "sdpa" and mixed
    layer = _layer_activations(
        shape, batch, seq_len, mixed=mixed, eager=eager, upcast=upcast, tp=tp
    )
    if shape.adapter_dropout:  # LoRA's dropped-out copy of each adapted layer's input, its mask
        e = 2 if mixed else 4
        # CUDA's fused dropout keeps a bool mask; on CPU dropout is a multiply by a mask of the
        # input's dtype, which autograd keeps (MulBackward0's `other`, torch 2.13).
        mask = MASK_BYTES if device == "cuda" else e
        layer += batch * seq_len * shape.adapter_inputs * (e + mask)
    stored = _stored_activations(shape, layer, params, batch, seq_len)
    head = _head_activations(shape, task, batch, seq_len, mixed=mixed)
    activations, logits = stored, head["kept"]
    if device == "cuda" and is_compiled(params):
        activations = int(activations * COMPILED_ACTIVATIONS_FACTOR)
        logits = int(logits * COMPILED_ACTIVATIONS_FACTOR)
    temporary = layer + head["gradient"]
    if value_of(params, "quantization") != "none":  # one weight dequantized at a time
        temporary += shape.largest_linear * (2 if mixed else 4)
    return activations, logits, temporary


def _stored_activations(
    shape: Shape, layer: int, params: dict[str, Any], batch: int, seq_len: int
) -> int:
    """What the blocks keep for the backward, each `layer` bytes unless checkpointed."""
    if not params.get("gradient_checkpointing"):
        return shape.layers * layer
    # A checkpointed block keeps its input (fp32 residual stream) and is recomputed one at
    # a time; with every_n_layers=n only blocks 0, n, 2n, ... are, the others keep theirs.
    every = value_of(params, "checkpointing_every_n_layers")
    checkpointed = -(-shape.layers // every)
    return (
        checkpointed * 4 * batch * seq_len * shape.hidden
        + layer
        + (shape.layers - checkpointed) * layer
    )


def _layer_activations(
    shape: Shape,
    b: int,
    s: int,
    *,
    mixed: bool,
    eager: bool,
    upcast: bool = False,
    tp: int = 1,
) -> int:
    """Bytes autograd keeps for one transformer block (see the module docstring); `upcast`:
    the attention runs in fp32 on 16-bit inputs (CPU SDPA under autocast); `tp`: the block's
    linears split that many ways (Megatron's layout: the heads and the MLP's width)."""
    h, i, a = shape.hidden, shape.intermediate, shape.heads
    e = 2 if mixed else 4  # matmul inputs and outputs
    tokens = b * s
    # QKV input, Q, K, V, attention output (proj input), MLP input: 6 h-wide tensors; the
    # MLP's pre- and post-activation: 2 i-wide; the two LayerNorm inputs: fp32 residuals.
    # Split tp ways: Q, K, V, the attention output and the MLP's width; the inputs of the
    # column-split layers and the residuals are whole on every rank.
    kept = tokens * ((2 * h + 4 * h // tp) * e + 2 * (i // tp) * e + 2 * h * 4)
    if shape.dropout:
        kept += tokens * 2 * h * MASK_BYTES
    if eager:
        scores = (a // tp) * s * s * b
        # Softmax output (fp32 under autocast too), its dropout mask, the matmul's copy.
        kept += scores * 4 + (scores * MASK_BYTES if shape.dropout else 0)
        kept += scores * e if shape.dropout or mixed else 0
        if upcast:  # fp32 copies of Q, K and V and of the dropped-out scores
            kept += tokens * 3 * (h // tp) * 4 + scores * (4 - e)
    return kept


def _head_activations(shape: Shape, task: str, b: int, s: int, *, mixed: bool) -> dict[str, int]:
    """The logits a language-model head keeps (16-bit under autocast, upcast to fp32 for the
    loss) and their gradient; a classification head's are negligible."""
    if task == "sequence-classification":
        return {"kept": 0, "gradient": 0}
    logits = b * s * shape.vocab
    kept = logits * (2 + 4 if mixed else 4)
    return {"kept": kept, "gradient": logits * 4}


def flops_per_sample(shape: Shape, seq_len: int, task: str = "causal-lm") -> float:
    """Training FLOPs of one sample of seq_len tokens (`training_flops`). The vocabulary
    matrix is a matmul only where a language-model head multiplies by it; for classification
    it is an embedding lookup."""
    matrices = shape.matrices
    if task == "sequence-classification":
        matrices = tuple(m for m in matrices if m != (shape.vocab, shape.hidden))
    matmul = sum(r * c for r, c in matrices)
    blocks = shape.layers + shape.cross_attention_layers
    if shape.adapter_parameters is None:
        return training_flops(matmul, blocks, shape.hidden, seq_len, seq_len**2)
    # The base frozen: its matmuls compute the activations' gradients, not their own.
    adapter = shape.adapter_parameters
    return training_flops(
        matmul + adapter, blocks, shape.hidden, seq_len, seq_len**2, frozen_weights=matmul
    )


# ---- calibration: the estimate against what a study's own trials measured ----


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """An ok trial's settings, its estimate before it ran and the peak it measured."""

    params: dict[str, Any]
    estimate_gib: float
    peak_gib: float


def mode_of(params: dict[str, Any]) -> str:
    """Everything but the batch size: for fixed other knobs the peak is close to linear in it."""
    return json.dumps({k: v for k, v in params.items() if k != "batch_size"}, sort_keys=True)


def calibrated_gib(params: dict[str, Any], estimate_gib: float, measured: list[Measured]) -> float:
    """The estimate corrected by the study's own measurements:
    - two or more batch sizes measured in this mode: the straight line through them (least
      squares), at this batch size;
    - one: this estimate shifted by that trial's measured - estimated;
    - none in this mode: shifted by the median measured - estimated of the trials compiled as
      this one is (`torch.compile` on or off), or of all trials when none is: the compile term
      (COMPILED_ACTIVATIONS_FACTOR) is one measured point, and eager trials do not correct it;
    - no trials yet: the estimate as it is.
    A shift, not a ratio: what the estimate misses on CPU is mostly a constant (the allocator's
    retained memory), and a ratio taken at a small batch would shrink the estimate of a large
    one (on the recorded landscapes, one smaller batch of the same mode gives a median error of
    3-9% shifted, 6-12% scaled)."""
    same = [m for m in measured if mode_of(m.params) == mode_of(params)]
    batches = {value_of(m.params, "batch_size") for m in same}
    if len(batches) >= 2:
        xs = [value_of(m.params, "batch_size") for m in same]
        ys = [m.peak_gib for m in same]
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
            (x - mean_x) ** 2 for x in xs
        )
        return mean_y + slope * (value_of(params, "batch_size") - mean_x)
    alike = [m for m in measured if is_compiled(m.params) == is_compiled(params)]
    pool = same or alike or measured
    if not pool:
        return estimate_gib
    return estimate_gib + statistics.median(m.peak_gib - m.estimate_gib for m in pool)
