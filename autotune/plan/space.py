"""Search spaces: the knobs a study searches, and Optuna suggestions from them.

`space_file` reads and validates them from YAML; this module holds the model and the sampling.
A space file looks like

    description: one line shown by `autotune spaces`
    device: cuda                      # cpu | cuda | any
    knobs:
      precision: {choices: [fp32, bf16]}
      batch_size: {low: 8, high: 128, multiple_of: auto}
      grad_accum: {choices: [1, 2, 4]}
      torch_compile: {choices: [off, inductor]}
      compile_mode: {choices: [default, max-autotune], when: {torch_compile: {not: off}}}
      dataloader_num_workers: 0       # a plain value fixes the knob

Batch sizes follow a rule that is data, not code: `multiple_of` (default 8). `auto` applies
the tensor-core rule to what the kernels see: on A100/H100-class GPUs 16-bit matmuls tile best
with rows in multiples of 64, and a transformer's matmuls have batch x seq_len rows. With
synthetic data every sample is seq_len tokens, so a 16-bit batch size is a multiple of
lcm(8, 64 / gcd(64, seq_len)): 8 at seq_len 512 or 128 (every multiple of 8 already gives 64-row
multiples), 16 at 100, 64 at an odd seq_len. Where lengths vary (the user's data or Trainer)
no batch size promises that, and the rule is multiples of 8, as it is for other precisions and
GPUs. Values below 8 (1, 2, 4) are allowed only when a space lists them in `choices`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import optuna

from autotune.common.knob_values import sixteen_bit
from autotune.common.knobs import KNOBS, SAMPLE_ORDER, active

DEVICES = ("cpu", "cuda", "any")
SMALL_BATCHES = (1, 2, 4)
BASE_MULTIPLE = 8
TENSOR_CORE_MULTIPLE = 64


@dataclass(frozen=True, kw_only=True, slots=True)
class Condition:
    """The knob is active only when `knob`'s value is (or, negated, is not) in `values`."""

    knob: str
    values: tuple[Any, ...]
    negate: bool = False

    def holds(self, params: dict[str, Any]) -> bool:
        return self.knob in params and ((params[self.knob] in self.values) != self.negate)


@dataclass(frozen=True, kw_only=True, slots=True)
class SpaceKnob:
    """A knob as one space searches it (the catalogue's `knobs.Knob` says what it is)."""

    name: str
    choices: tuple[Any, ...]
    """Every value the knob may take (ranges are expanded)."""
    is_range: bool = False
    multiple_of: int | str | None = None
    """batch_size only: 8, 64, ..., or `auto`."""
    when: tuple[Condition, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class SamplingRules:
    """What the run adds to the space: fixed effective batch, tensor-core tiling."""

    effective_batch_size: int | None = None
    """The batch a rank trains at per optimizer step, fixed: grad_accum is derived from it."""
    tensor_core_64: bool = False
    """An A100/H100-class GPU: 16-bit matmuls tile best with rows in multiples of 64."""
    tokens_per_sample: int | None = None
    """Every sample's length in tokens when all have one (synthetic data: seq_len); None when
    lengths vary (the user's data or Trainer)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    name: str
    description: str
    device: str
    knobs: dict[str, SpaceKnob]
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What capability filtering removed and why, and knobs that cannot matter here."""

    def with_choices(self, knob: str, choices: tuple[Any, ...]) -> SearchSpace:
        knobs = dict(self.knobs)
        knobs[knob] = replace(knobs[knob], choices=choices)
        return replace(self, knobs=knobs)

    def batch_candidates(self, precision: str | None, rules: SamplingRules) -> tuple[int, ...]:
        """Batch sizes allowed for a trial with this precision under the run's rules."""
        knob = self.knobs["batch_size"]
        multiple = multiple_for(knob, precision, rules)
        return _batch_values(knob.choices, multiple, knob.is_range, rules.effective_batch_size)

    def grid(self, rules: SamplingRules) -> dict[str, list[Any]]:
        """Every Optuna parameter `sample` may suggest, with all its values (for GridSampler)."""
        grid: dict[str, list[Any]] = {}
        precisions = self.knobs["precision"].choices if "precision" in self.knobs else (None,)
        for name in SAMPLE_ORDER:
            knob = self.knobs.get(name)
            if knob is None or len(knob.choices) == 1:
                continue
            if name == "batch_size":
                for precision in precisions:
                    candidates = self.batch_candidates(precision, rules)
                    if len(candidates) > 1:
                        multiple = multiple_for(knob, precision, rules)
                        grid[_batch_param(multiple)] = list(candidates)
            elif not (name == "grad_accum" and rules.effective_batch_size):
                grid[name] = list(knob.choices)
        return grid

    def sample(self, trial: optuna.Trial, rules: SamplingRules) -> dict[str, Any]:
        """Suggest one configuration (define-by-run: conditions see earlier choices)."""
        params: dict[str, Any] = {}
        for name in SAMPLE_ORDER:
            knob = self.knobs.get(name)
            if knob is None or not active(name, params):
                continue
            if not all(c.holds(params) for c in knob.when):
                continue
            if name == "batch_size":
                params[name] = _suggest_batch(self, trial, params.get("precision"), rules)
            elif name == "grad_accum" and rules.effective_batch_size:
                continue  # derived below
            elif len(knob.choices) == 1:
                params[name] = knob.choices[0]
            elif knob.is_range:
                params[name] = trial.suggest_int(name, knob.choices[0], knob.choices[-1])
            else:
                params[name] = trial.suggest_categorical(name, knob.choices)
        if rules.effective_batch_size:
            params["grad_accum"] = rules.effective_batch_size // params["batch_size"]
        return {k: params[k] for k in KNOBS if k in params}

    def points(
        self,
        rules: SamplingRules,
        *,
        limit: int,
        rng: np.random.Generator | None = None,
        first: Sequence[dict[str, Any]] = (),
    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Every setting `sample` can suggest, with its Optuna parameters: (settings,
        {parameter: value}). A space of more than `limit` settings gives `limit` of them drawn
        at random (each parameter's value drawn in turn; repeats dropped), those of `first`
        that are settings of the space among them."""
        found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        stack: list[dict[str, Any]] = [{}]
        while stack and len(found) <= limit:
            fixed = stack.pop()
            try:
                params = self.sample(_Walker(fixed), rules)  # type: ignore[arg-type]
            except _Branch as branch:
                stack += [{**fixed, branch.name: c} for c in reversed(branch.choices)]
                continue
            found[_key(params)] = (params, fixed)
        if len(found) <= limit:
            return list(found.values())
        found, rng = {}, rng or np.random.default_rng(0)
        for params in first:
            fixed = {name: value for name, (_, value) in self.optuna_params(params, rules).items()}
            walker = _Walker(fixed, rng)
            sampled = self.sample(walker, rules)
            if sampled == params:  # one of the space's own settings
                asked = {k: v for k, v in walker.fixed.items() if k in walker.asked}
                found[_key(sampled)] = (sampled, asked)
        for _ in range(limit * 2):
            walker = _Walker({}, rng)
            params = self.sample(walker, rules)  # type: ignore[arg-type]
            found.setdefault(_key(params), (params, walker.fixed))
            if len(found) == limit:
                break
        return list(found.values())

    def optuna_params(
        self, params: dict[str, Any], rules: SamplingRules
    ) -> dict[str, tuple[optuna.distributions.BaseDistribution, Any]]:
        """Settings chosen outside the sampler (the baseline) as Optuna parameters, so Optuna's
        tools and the sampler see them: name -> (distribution, value).

        A knob `sample` would suggest keeps the very distribution it suggests with, when the
        value lies in it; a value outside is left out (a study holds one distribution per
        parameter name). A knob the space never suggests gets a one-value distribution.
        """
        recorder = self._record(params, rules)
        found = {
            name: (distribution, recorder.value(name))
            for name, distribution in recorder.distributions.items()
            if _holds(distribution, recorder.value(name))
        }
        suggested = set(self.grid(rules)) | set(recorder.distributions)
        for name, value in params.items():
            if name not in suggested:
                found[name] = (optuna.distributions.CategoricalDistribution([value]), value)
        return found

    def distributions(
        self, rules: SamplingRules, *, draws: int = 256
    ) -> dict[str, optuna.distributions.BaseDistribution]:
        """The Optuna parameters `sample` suggests, with the distribution of each (a study holds
        one per name), seen over `draws` random walks of the space (seeded: the same each time;
        a parameter suggested on fewer than ~2% of the settings may be missed)."""
        rng = np.random.default_rng(0)
        seen: dict[str, optuna.distributions.BaseDistribution] = {}
        for _ in range(draws):
            walker = _Walker({}, rng)
            self.sample(walker, rules)  # type: ignore[arg-type]
            seen.update(walker.distributions)
        return seen

    def holds(self, params: dict[str, Any], rules: SamplingRules) -> bool:
        """Whether every parameter `sample` would suggest for these settings holds their
        value: then they are a point of the space as the samplers see it."""
        recorder = self._record(params, rules)
        return all(
            _holds(distribution, recorder.value(name))
            for name, distribution in recorder.distributions.items()
        )

    def _record(self, params: dict[str, Any], rules: SamplingRules) -> _Recorder:
        recorder = _Recorder(params)
        self.sample(recorder, rules)  # type: ignore[arg-type]  # walks the same conditions
        return recorder


def _holds(distribution: optuna.distributions.BaseDistribution, value: Any) -> bool:
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return value in distribution.choices
    return distribution.low <= value <= distribution.high


def _key(params: dict[str, Any]) -> tuple:
    """Settings as a key: settings are scalars by knob (what a space file can write)."""
    return tuple(sorted(params.items()))


class _Branch(Exception):
    def __init__(self, name: str, choices: tuple[Any, ...]) -> None:
        self.name, self.choices = name, choices


class _Walker:
    """Stands in for an Optuna trial in `SearchSpace.sample` to enumerate the space: answers
    the parameters in `fixed` and branches on the first other one (or, with `rng`, draws it)."""

    def __init__(self, fixed: dict[str, Any], rng: np.random.Generator | None = None) -> None:
        self.fixed = fixed
        self.rng = rng
        self.asked: dict[str, tuple[Any, ...] | range] = {}
        """Parameter -> its choices (a range for an integer one), as suggested."""

    @property
    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        """The Optuna distribution of each parameter asked for (made only when wanted: an
        enumeration walks tens of thousands of settings)."""
        return {
            name: optuna.distributions.IntDistribution(choices.start, choices.stop - 1)
            if isinstance(choices, range)
            else optuna.distributions.CategoricalDistribution(choices)
            for name, choices in self.asked.items()
        }

    def suggest_categorical(self, name: str, choices: tuple[Any, ...]) -> Any:
        self.asked[name] = choices
        return self._value(name, choices)

    def suggest_int(self, name: str, low: int, high: int) -> int:
        self.asked[name] = choices = range(low, high + 1)
        return self._value(name, tuple(choices))

    def _value(self, name: str, choices: tuple[Any, ...]) -> Any:
        if name not in self.fixed:
            if self.rng is None:
                raise _Branch(name, tuple(choices))
            self.fixed[name] = choices[int(self.rng.integers(len(choices)))]
        return self.fixed[name]


class _Recorder:
    """Stands in for an Optuna trial in `SearchSpace.sample`: answers with given settings and
    notes the distribution of every parameter asked for."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.distributions: dict[str, optuna.distributions.BaseDistribution] = {}

    def value(self, name: str) -> Any:
        return self.params[_knob_of(name)]

    def suggest_categorical(self, name: str, choices: tuple[Any, ...]) -> Any:
        return self._answer(name, optuna.distributions.CategoricalDistribution(choices))

    def suggest_int(self, name: str, low: int, high: int) -> int:
        return self._answer(name, optuna.distributions.IntDistribution(low, high))

    def _answer(self, name: str, distribution: optuna.distributions.BaseDistribution) -> Any:
        if _knob_of(name) not in self.params:  # asked only because the space fixes another knob
            return distribution.to_external_repr(0)
        self.distributions[name] = distribution
        return self.value(name)


def multiple_for(knob: SpaceKnob, precision: str | None, rules: SamplingRules) -> int:
    """What every batch size of a trial in this precision is a multiple of under the rules."""
    if knob.multiple_of != "auto":
        return knob.multiple_of or 1
    if not (rules.tensor_core_64 and sixteen_bit(precision)) or rules.tokens_per_sample is None:
        return BASE_MULTIPLE  # where lengths vary, no batch size promises 64-row multiples
    # The matmuls see batch x tokens_per_sample rows: the batch supplies only the factors of 64
    # the sample length lacks (on an H100 at seq_len 512, bf16 bs 32 ran within 7% of bs 64).
    lacking = TENSOR_CORE_MULTIPLE // math.gcd(TENSOR_CORE_MULTIPLE, rules.tokens_per_sample)
    return math.lcm(BASE_MULTIPLE, lacking)


@functools.cache
def _batch_values(
    choices: tuple[int, ...], multiple: int, is_range: bool, effective_batch_size: int | None
) -> tuple[int, ...]:
    """`SearchSpace.batch_candidates`, of what it depends on: asked once a setting, so kept."""
    # Values below 8 are there only because the space lists them: they stay under any rule.
    values = [v for v in choices if v % multiple == 0 or (v in SMALL_BATCHES and not is_range)]
    if effective_batch_size:
        values = [v for v in values if effective_batch_size % v == 0]
    return tuple(values)


def _suggest_batch(
    space: SearchSpace, trial: optuna.Trial, precision: str | None, rules: SamplingRules
) -> int:
    candidates = space.batch_candidates(precision, rules)
    if len(candidates) == 1:
        return candidates[0]
    multiple = multiple_for(space.knobs["batch_size"], precision, rules)
    return trial.suggest_categorical(_batch_param(multiple), candidates)


def _batch_param(multiple: int) -> str:
    # One Optuna parameter per rule: each keeps the same choices in every trial, as Optuna
    # requires, and the sampler learns 16-bit tensor-core batch sizes on their own. Precisions
    # under the same multiple share one parameter (`batch_size` at 8 or less).
    return "batch_size" if multiple <= BASE_MULTIPLE else f"batch_size_x{multiple}"


def _knob_of(param: str) -> str:
    """The knob behind an Optuna parameter name (`batch_size_x64` -> `batch_size`)."""
    return "batch_size" if param.startswith("batch_size") else param
