"""The sampler the loop asks (`sampler=`), and the one way a queued value is suggested."""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.common.errors import ConfigError
from autotune.plan.plan import SearchPlan


def make_sampler(plan: SearchPlan, *, seed: int) -> optuna.samplers.BaseSampler:
    """The configured sampler. The effects model, TPE, NSGA-II and GP learn from trials that ran
    out of memory (the model, from their peaks; Optuna's, from each trial's constraint), so
    such trials steer them away; random and grid ignore constraints."""
    name = plan.config.sampler
    if name == "gp":
        # Optuna's GP models the knobs jointly and takes running trials into account (other
        # workers' proposals). It runs on torch in this process (CPU tensors, never CUDA), a
        # second or so per proposal, and needs scipy.
        if importlib.util.find_spec("scipy") is None:
            raise ConfigError(
                'sampler=gp needs scipy: pip install "autotune[gp]", or use sampler=tpe'
            )
        import torch

        # One thread: other workers' trials may be running on the cores while this one asks.
        torch.set_num_threads(1)
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)
    if name == "tpe":
        # Multivariate TPE models the knobs jointly (batch size and checkpointing interact);
        # `group` splits the conditional space (compile_mode, 64-multiple batches) into parts
        # that always appear together, instead of falling back to independent sampling.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # constant_liar: trials other processes are running count as bad results while
            # they run, so several workers do not all ask for the same point.
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, constant_liar=True
            )
    if name in ("auto", "effects"):
        # The `auto` pick, after benchmarks/replay.py: on landscapes where no memory edge
        # narrows the space, TPE misses the fastest settings that this model finds.
        from autotune.study.sampling.effects import EffectsSampler

        return EffectsSampler(plan, seed=seed)
    if name == "nsga2":
        population = max(4, min(50, plan.config.n_trials // 4))
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=population)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return AskTellGridSampler(plan.space.grid(plan.rules), seed=seed)


def says_enough(sampler: optuna.samplers.BaseSampler, trial: optuna.Trial) -> str | None:
    """Why the search should stop before this trial, where the sampler can tell (`sampler=auto`:
    no untried setting is worth its trial, `EffectsSampler.enough`)."""
    enough = getattr(sampler, "enough", None)
    return enough(trial.number) if enough is not None else None


class AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid, for an ask-and-tell loop: `run_search` checks `is_exhausted` itself.

    GridSampler ends a study by calling `study.stop()` after the last grid point, which only
    works inside `study.optimize`; told through `study.tell` it raises."""

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: list[float] | None,
    ) -> None:
        pass


def suggest(
    trial: optuna.Trial, name: str, distribution: optuna.distributions.BaseDistribution
) -> Any:
    """`trial.suggest_*` for a distribution: a queued trial answers with its queued value."""
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return trial.suggest_categorical(name, distribution.choices)
    assert isinstance(distribution, optuna.distributions.IntDistribution), distribution
    return trial.suggest_int(
        name, distribution.low, distribution.high, step=distribution.step, log=distribution.log
    )


def quiet_optuna() -> None:
    """Optuna's INFO lines ("A new study created ...") say less than ours, and twice."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
