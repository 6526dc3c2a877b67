"""The space a run searches and the rules it is sampled under: `space=` loaded (auto: by the
device), fitted to the device, the model, the data source and a trial's cores (`capabilities`),
then to the batch-size rule and a rank's effective batch (`batch_rule`). Each problem is added
to the plan's, so that every one is named at once.
"""

from __future__ import annotations

from autotune.common.device import DeviceInfo
from autotune.common.errors import AutotuneError, ConfigError
from autotune.common.placement import Placement
from autotune.plan.batch_rule import apply_sampling_rules
from autotune.plan.capabilities import fit_space, fit_to_nodes, fit_tp_to_run, trial_cores
from autotune.plan.config import RunConfig
from autotune.plan.space import SamplingRules, SearchSpace
from autotune.plan.space_file import SoftwareFacts, load_space


def sampling_rules(
    config: RunConfig,
    ranks: int,
    device: str,
    device_info: DeviceInfo,
    source: str,
    problems: list[str],
) -> SamplingRules:
    """The rules the run adds to the space: a rank's effective batch (`ranks` to a trial), the
    tensor cores' tiling and, with random tokens, the sample length."""
    return SamplingRules(
        effective_batch_size=_per_device_batch(config.effective_batch_size, ranks, problems),
        tensor_core_64=device == "cuda" and device_info.tensor_core_64,
        # Random tokens are all seq_len long; the user's data is padded per batch, and a
        # Trainer's collator is its own.
        tokens_per_sample=config.seq_len if source == "synthetic" else None,
    )


def fitted_space(
    config: RunConfig,
    ranks: int,
    device: str,
    device_info: DeviceInfo,
    facts: SoftwareFacts,
    rules: SamplingRules,
    source: str,
    slots: list[Placement],
    problems: list[str],
    model_type_and_task: tuple[str, str] | None = None,
) -> SearchSpace | None:
    """The space `space=` names (auto: `default` on cuda, `lora` there with an adapter, `cpu`
    on cpu), fitted to the device, the model, the data source and the cores each trial has;
    None, with the problem added to `problems`, when it cannot be. `ranks`: a trial's."""
    # On a GPU an adapter's job has a space of its own (micro batches from 1, the base's knobs).
    auto_space = ("lora" if config.peft != "none" else "default") if device == "cuda" else "cpu"
    space_name = auto_space if config.space == "auto" else config.space
    try:
        space = load_space(space_name, facts)
        if space.device not in ("any", device):
            raise ConfigError(
                f"space={space.name} is for device={space.device}, but this search runs on {device}"
            )
        cores = trial_cores(slots)  # loader workers beyond them are taken out of the space
        fitted = fit_space(
            space,
            device,
            device_info,
            source,
            cores,
            ranks,
            model_type_and_task,
            adapter=config.peft != "none",
        )
        fitted = fit_to_nodes(fitted, slots[0].nodes if slots else 1)
        fitted = fit_tp_to_run(
            fitted,
            trainer=config.trainer is not None,
            fixed_batch=config.effective_batch_size is not None,
            adapter=config.peft != "none",
        )
        return apply_sampling_rules(fitted, rules)
    except AutotuneError as exc:
        problems.append(str(exc))
        return None


def _per_device_batch(total: int | None, ranks: int, problems: list[str]) -> int | None:
    """The effective batch a rank trains at: `effective_batch_size` over the trial's ranks."""
    if total is None:
        return None
    if total % ranks:
        problems.append(
            f"effective_batch_size={total} does not split evenly between "
            f"devices_per_trial={ranks} ranks"
        )
        return None
    return total // ranks
