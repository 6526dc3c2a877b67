"""The timing window and memory peaks of one trial (worker side).

Shape of the measurement, as in nanoGPT's bench.py: untimed warm-up steps first, the device
synchronised before each clock read, and only whole optimizer steps inside the timed window.
The Trainer's own `train_samples_per_second` includes warm-up and start-up, so it is not used.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import math
import resource
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback

from autotune.common import flops
from autotune.common.trial import stopped_reason


class StageClock:
    """Seconds a trial spends in each named stage before training (`cuda_init_s`,
    `model_build_s`, `data_s`, `trainer_init_s`): the parts of its cost that are not steps."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


@dataclass(frozen=True, slots=True)
class Counts:
    """What the training loop took from its loader: samples, and tokens of `input_ids`."""

    samples: int = 0
    tokens: int = 0
    """Real tokens: padding (attention mask 0) not counted."""
    padded_tokens: int = 0
    """Every position of the batches, padding included: what the model computes on."""
    squared_lengths: int = 0
    """Sum over samples of (real tokens)^2: attention's FLOPs grow with it."""

    def __sub__(self, other: Counts) -> Counts:
        return Counts(*(a - b for a, b in zip(self.astuple(), other.astuple(), strict=True)))

    def astuple(self) -> tuple[int, int, int, int]:
        return (self.samples, self.tokens, self.padded_tokens, self.squared_lengths)


class BatchCounter:
    """Counts the batches a Trainer's training loop takes, as it takes them (in the training
    process, after the loader's workers have collated them).

    `count_batches(trainer)` wraps the Trainer's own `get_train_dataloader`, so it counts what
    any Trainer trains on, a user's own included. The HF loop takes the batches of optimizer
    step k after step k-1 has ended, so the counts read at a step's end hold that step's.
    """

    def __init__(self) -> None:
        self.counts = Counts()
        self.longest = 0
        """The longest row of `input_ids` seen (padding included): the sequence length the
        Trainer really trains at, whatever `seq_len=` says (a user's own Trainer)."""

    def count(self, batch: Any) -> None:
        import torch

        ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
        if not isinstance(ids, torch.Tensor):  # no tokens to count: samples only
            first = next((v for v in _values(batch) if isinstance(v, torch.Tensor)), None)
            rows = len(first) if first is not None and first.dim() else 0
            self.counts = Counts(self.counts.samples + rows, *self.counts.astuple()[1:])
            return
        self.longest = max(self.longest, int(ids.shape[-1]))
        mask = batch.get("attention_mask")
        lengths = (
            mask.sum(dim=-1)
            if isinstance(mask, torch.Tensor)
            else torch.full((ids.shape[0],), ids.shape[-1], device=ids.device)
        )
        tokens, squared = torch.stack([lengths.sum(), (lengths * lengths).sum()]).tolist()
        self.counts = Counts(
            self.counts.samples + ids.shape[0],
            self.counts.tokens + int(tokens),
            self.counts.padded_tokens + ids.numel(),
            self.counts.squared_lengths + int(squared),
        )


def _values(batch: Any) -> list[Any]:
    if isinstance(batch, Mapping):  # a dict, or the BatchEncoding HF collators return
        return list(batch.values())
    return list(batch) if isinstance(batch, list | tuple) else [batch]


class _CountedLoader:
    """A training loader that tells `counter` each batch as the loop takes it; everything else
    (length, sampler, set_epoch) is the loader's own."""

    def __init__(self, loader: Any, counter: BatchCounter) -> None:
        self._loader = loader
        self._counter = counter

    def __iter__(self) -> Any:
        for batch in self._loader:
            self._counter.count(batch)
            yield batch

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _LongestBatches:
    """A training loader whose batches `start` to `start + count - 1` of the run (a warm-up
    step's; counted over its epochs, once) are replaced by the longest batch it could ever
    give: its `size` longest samples, collated by its own collator. The peak then covers the
    longest batch of the whole run, whatever the sampler (random or grouped by length) would
    have met in a few steps. Its length is the loader's."""

    def __init__(self, loader: Any, size: int, start: int, count: int) -> None:
        self._loader = loader
        self._size = size
        self._replaced = range(start, start + count)
        self._taken = 0
        """Batches the run took so far, over every epoch's pass."""

    def __iter__(self) -> Any:
        longest = None
        if self._taken < self._replaced.stop:
            longest = longest_indices(self._loader.dataset, self._size)
        for batch in self._loader:
            replaced = longest is not None and self._taken in self._replaced
            self._taken += 1
            if replaced:
                yield self._loader.collate_fn([self._loader.dataset[i] for i in longest])
            else:
                yield batch

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def longest_indices(dataset: Any, size: int) -> list[int] | None:
    """The indices of the `size` longest samples of a datasets.Dataset (by its `length`
    column, else its `input_ids`); None where the lengths cannot be read."""
    columns = getattr(dataset, "column_names", None) or ()
    if not (hasattr(dataset, "with_format") and hasattr(dataset, "__len__")) or not (
        {"length", "input_ids"} & set(columns)
    ):
        return None  # not a datasets.Dataset with token ids (an iterable one has no length)
    import pyarrow.compute as pc

    # Arrow's own columns, no transform applied and no row built: a pass over the lengths.
    table = dataset.with_format("arrow")
    if "length" in columns:
        lengths = table["length"]
    else:
        lengths = pc.list_value_length(table["input_ids"])
    return pc.sort_indices(lengths, sort_keys=[("", "descending")])[:size].to_pylist()


def longest_at(trainer: Any, step: int) -> None:
    """Train optimizer step `step` (1-based; the last warm-up step, outside the timed window)
    on the longest batch the data holds, so the trial's peak memory includes it. From the
    second step on the optimizer's states exist beside it, as in the rest of the run."""
    size = trainer.args.per_device_train_batch_size
    accumulation = trainer.args.gradient_accumulation_steps
    start = (step - 1) * accumulation
    make_loader = trainer.get_train_dataloader
    trainer.get_train_dataloader = lambda: _LongestBatches(make_loader(), size, start, accumulation)


def count_batches(trainer: Any) -> BatchCounter:
    """Count the batches `trainer.train()` takes (see `BatchCounter`)."""
    counter = BatchCounter()
    make_loader = trainer.get_train_dataloader
    trainer.get_train_dataloader = lambda: _CountedLoader(make_loader(), counter)
    return counter


class StepTimer(TrainerCallback):
    """Records the clock (and, given a `BatchCounter`, what was trained on) at the end of every
    optimizer step.

    Batches are fetched before `on_step_begin`, so step boundaries are taken end to end: the
    interval from the end of step k to the end of step k+1 holds everything step k+1 costs,
    data loading included. Warm-up step w's end opens the timed window.
    """

    def __init__(
        self,
        warmup_steps: int,
        synchronize: Callable[[], None] = lambda: None,
        counter: BatchCounter | None = None,
        stop_below: float | None = None,
        stop_after: int = 3,
    ):
        if warmup_steps < 1:
            raise ValueError("warmup_steps must be >= 1: the first step's end opens the window")
        self.warmup_steps = warmup_steps
        self.synchronize = synchronize
        self.counter = counter or BatchCounter()
        self.train_begin_s: float | None = None
        self.step_end_s: list[float] = []
        self.step_end_counts: list[Counts] = []
        self.stop_below = stop_below
        """samples/s: after `stop_after` timed steps, training stops when even the fastest of
        them was slower (`stopped` then says why); None: never."""
        self.stop_after = stop_after
        self.stopped: str | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.synchronize()
        self.train_begin_s = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.synchronize()
        self.step_end_s.append(time.perf_counter())
        self.step_end_counts.append(self.counter.counts)
        times = self.measured_step_times_s()
        if self.stop_below is None or len(times) != self.stop_after or not times:
            return
        # The fastest a step went: an upper bound of the pace (each step trains as much).
        fastest = self.measured_counts().samples / len(times) / min(times)
        if fastest < self.stop_below:
            control.should_training_stop = True
            self.stopped = stopped_reason(len(times), fastest, self.stop_below)

    def measured_step_times_s(self) -> list[float]:
        ends = self.step_end_s[self.warmup_steps - 1 :]
        return [later - earlier for earlier, later in itertools.pairwise(ends)]

    def measured_counts(self) -> Counts:
        """What the timed steps trained on (from the end of warm-up to the last step's end)."""
        if len(self.step_end_counts) < self.warmup_steps:
            return Counts()
        return self.step_end_counts[-1] - self.step_end_counts[self.warmup_steps - 1]

    def warmup_step_times_s(self) -> list[float]:
        """The untimed steps; the first runs from the start of training (compile lands here)."""
        assert self.train_begin_s is not None, "on_train_begin was not called"
        ends = [self.train_begin_s, *self.step_end_s[: self.warmup_steps]]
        return [later - earlier for earlier, later in itertools.pairwise(ends)]


ETA_WINDOW_S = 60.0
"""The recent past an ETA is paced by: a long run's pace drifts as the machine's load does."""


def eta_s(step_end_s: list[float], total_steps: int) -> float | None:
    """Seconds until step `total_steps` ends, from the clock readings at each step end so far.

    The first step runs from the start of training and holds what is paid once (compiling, the
    allocator's first growth, lazy initialisation): it would make the estimate many times too
    long, so only the steps after it count. The pace is the mean of those that ended in the
    last `ETA_WINDOW_S` (at least the last one): the mean, as the steps left take their sum
    (the stalls that recur included, which a median leaves out), and the last minute's, as
    the pace of a long run drifts with the machine's load, and a minute holds many steps of
    any model (a 1,500-step verify whose machine was loaded 40 s in, paced by the median of
    all its steps, promised 14 s for what took 48 s). None until a step after the first has
    ended.
    """
    if len(step_end_s) < 2:
        return None
    # Called at every step inside the timed window: a bisection of the (rising) clock
    # readings, not a pass over all of them (a verify may run 100,000 steps).
    first = bisect.bisect_left(step_end_s, step_end_s[-1] - ETA_WINDOW_S)
    first = min(first, len(step_end_s) - 2)  # at least the last step
    typical_s = (step_end_s[-1] - step_end_s[first]) / (len(step_end_s) - 1 - first)
    return (total_steps - len(step_end_s)) * typical_s


def compile_s(warmup_step_times_s: list[float], median_step_s: float) -> float:
    """Time the warm-up spent beyond ordinary steps: graph capture and compilation."""
    return sum(max(0.0, t - median_step_s) for t in warmup_step_times_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class Throughput:
    samples_per_s: float
    tokens_per_s: float | None
    """Real tokens (padding not counted); None when the batches hold no `input_ids`."""
    padding_share: float | None
    """Padding among the positions computed on: 1 - real / padded tokens."""
    step_time_median_ms: float
    step_time_cv: float
    measured_steps: int


def throughput(step_times_s: list[float], counts: Counts) -> Throughput:
    """Throughput over the timed steps, from what they trained on (`counts`)."""
    if len(step_times_s) < 2:
        raise ValueError(f"need at least 2 timed steps, got {len(step_times_s)}")
    total_s = sum(step_times_s)
    has_tokens = counts.padded_tokens > 0
    return Throughput(
        samples_per_s=counts.samples / total_s,
        tokens_per_s=counts.tokens / total_s if has_tokens else None,
        padding_share=1 - counts.tokens / counts.padded_tokens if has_tokens else None,
        step_time_median_ms=statistics.median(step_times_s) * 1e3,
        step_time_cv=statistics.stdev(step_times_s) / statistics.fmean(step_times_s),
        measured_steps=len(step_times_s),
    )


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---- model FLOPs and MFU ----


def numel(parameter: Any) -> int:
    """A parameter's size, however it is sharded or quantized: a DTensor's is its global one;
    ZeRO-3 keeps it in `ds_numel` (the tensor itself is emptied between uses); bitsandbytes'
    4-bit weight packs two a byte, its shape in `quant_state`."""
    quant_state = getattr(parameter, "quant_state", None)
    if quant_state is not None:
        return math.prod(quant_state.shape)
    return getattr(parameter, "ds_numel", None) or parameter.numel()


def matmul_parameters(model: Any) -> int:
    """Weights that take part in a matrix multiply per token (Linear and GPT-2's Conv1D).

    Counted per module, so a tied LM head counts: its matmul runs even though the weight is the
    embedding's. Embedding lookups, norms and biases do no matmul and are left out.
    """

    return sum(numel(weight) for weight in _matmul_weights(model))


def frozen_matmul_parameters(model: Any) -> int:
    """The matmul weights that get no gradient (a base an adapter trains on): their backward
    computes the activations' gradients but not their own."""
    return sum(numel(weight) for weight in _matmul_weights(model) if not weight.requires_grad)


def _matmul_weights(model: Any) -> list[Any]:
    import torch
    from transformers.pytorch_utils import Conv1D

    return [
        module.weight for module in model.modules() if isinstance(module, torch.nn.Linear | Conv1D)
    ]


def attention_layers(config: Any) -> tuple[int, int]:
    """(attention blocks over the sequence, width of Q.K^T): cross-attention counts as a block."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or getattr(config, "d_kv", None)
    width = heads * head_dim if head_dim else config.hidden_size
    if config.is_encoder_decoder:
        decoder = getattr(config, "num_decoder_layers", None) or config.num_hidden_layers
        return config.num_hidden_layers + 2 * decoder, width
    return config.num_hidden_layers, width


def training_flops(model: Any, counts: Counts) -> float:
    """Training FLOPs for what `counts` holds (`flops.training_flops`), counting the real
    tokens: padding is work that trains nothing. Encoder-decoder models see each sample on
    both sides."""
    blocks, width = attention_layers(model.config)
    return flops.training_flops(
        matmul_parameters(model),
        blocks,
        width,
        counts.tokens,
        counts.squared_lengths,
        frozen_weights=frozen_matmul_parameters(model),
    )
