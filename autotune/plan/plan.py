"""Everything a search needs, resolved and checked before the first trial starts.

Turns a `RunConfig` into a `SearchPlan`: the model's config, the task, the device (from the
probe subprocess), the memory budget, the search space and where the study lives. Problems
with the model and the space are reported together.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.common.cluster import Cluster
from autotune.common.device import DeviceInfo, cpu_reserve_bytes
from autotune.common.errors import AutotuneError, ConfigError
from autotune.common.knobs import NAMING_FIELDS, value_of
from autotune.common.layout import DATA_CACHE, study_db_url
from autotune.common.models import ModelSpec, catalogue_parameter_counts, resolve_model
from autotune.common.output_files import check_owner
from autotune.common.placement import Placement
from autotune.common.trial import TrialResult
from autotune.common.trial_settings import baseline_params, effective_batch
from autotune.common.units import GIB, format_bytes
from autotune.common.user_data import DataSpec
from autotune.plan import conditions
from autotune.plan.capabilities import ADAPTER_KNOBS, trial_cores
from autotune.plan.config import RunConfig
from autotune.plan.estimate import CUDA_CONTEXT_BYTES, Estimate, UnknownShape, estimate
from autotune.plan.factory_model import EstimatedModel, factory_model
from autotune.plan.inputs import data_spec, input_problems, trainer_info
from autotune.plan.run_info import RunInfo
from autotune.plan.run_space import fitted_space, sampling_rules
from autotune.plan.setting_types import STUDY_NAME_MAX_CHARS
from autotune.plan.slots import assign, cluster_slots, trials_per_node
from autotune.plan.space import SamplingRules, SearchSpace
from autotune.plan.space_file import SoftwareFacts


@dataclass(frozen=True, kw_only=True, slots=True)
class Reference:
    """What speedups are told against where the HF defaults do not fit: their settings with the
    guides' low-memory recipe (`SearchPlan.reference`)."""

    params: dict[str, Any]
    recipe: str
    """What it changes of the HF defaults, in words."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchPlan:
    config: RunConfig
    model: ModelSpec
    info: RunInfo
    """What the study is run for (stored with it): task, device, budget, ..."""
    space: SearchSpace
    """Fitted to the device: its notes say what was removed and why."""
    rules: SamplingRules
    baseline: dict[str, object]
    """The HF default TrainingArguments as knobs: the first trial, the yardstick for speedups."""
    study_dir: Path
    storage_url: str
    device_info: DeviceInfo
    slots: list[Placement]
    """One per worker: the device or the cores it owns (`workers=`, `devices=`)."""
    data: DataSpec | None = None
    """The user's data (`data=`); None: synthetic tokens or the user's Trainer."""
    search_dir: Path = Path()
    """The working directory the search was started in: a `trainer=` module is looked up
    there, as `python -m` would."""
    host_limit_bytes: int | None = None
    """On CPU, the most a trial can grow before the machine itself runs out (the default
    budget: `common.device.cpu_budget_bytes`); None on CUDA."""

    def estimate_gib(
        self, params: dict[str, Any], factory: TrialResult | None = None
    ) -> float | None:
        """The peak `autotune.plan.estimate` gives these settings before they run, as a trial
        measures it and the memory budget caps it (`Estimate.budgeted`: on CUDA the allocator's
        figure, without the CUDA context); None for a config whose dimensions it cannot read
        (no skip by estimate then). With `trainer=`, of the model the factory trains, as a
        trial of it reported it (`factory`: that trial's result); None before one has."""
        if self.info.trainer is None:
            found = self._estimate(params)
        elif (
            factory is not None
            and factory.trained_config
            and factory.trained_task
            and factory.trained_seq_len
        ):
            # The user's factory decides the model and the data: `model=` and `seq_len=` only
            # name the study. What it trains is known once a trial of it has run.
            found = self._estimate(*factory_model(params, factory))
        else:
            return None
        return None if found is None else found.budgeted / GIB

    def compute_tflops(self, precision: str) -> float | None:
        """The fastest a step of this precision computes on the search's device (TFLOP/s:
        `DeviceInfo.compute_tflops`); None when unknown."""
        return self.device_info.compute_tflops(self.device, precision)

    def compute_floor_s(self, params: dict[str, Any]) -> tuple[float, float] | None:
        """(seconds, TFLOP/s): the least time a trial of these settings can take to compute
        its warm-up and timed steps, at the fastest this device computes
        (`DeviceInfo.compute_tflops`, or `peak_tflops=`); None when either is unknown."""
        found = self._estimate(params)
        rate = self.config.peak_tflops or self.compute_tflops(str(value_of(params, "precision")))
        if found is None or not rate:
            return None
        samples = self.trial_steps * effective_batch(params)
        return samples * found.flops_per_sample / (rate * 1e12), rate

    def least_trial_s(self) -> tuple[float, float] | None:
        """`compute_floor_s` of the least work a trial of the space can do: its smallest batch
        (and accumulation), without checkpointing, in its fastest precision; (seconds,
        TFLOP/s), None when unknown. Over `trial_timeout`, every trial would time out."""
        knobs = self.space.knobs
        cheapest = dict(self.baseline) | {"gradient_checkpointing": False}
        if "batch_size" in knobs:
            cheapest["batch_size"] = min(knobs["batch_size"].choices)
        if self.rules.effective_batch_size:
            cheapest["grad_accum"] = max(
                1, self.rules.effective_batch_size // value_of(cheapest, "batch_size")
            )
        elif "grad_accum" in knobs:
            cheapest["grad_accum"] = min(knobs["grad_accum"].choices)
        precisions = knobs["precision"].choices if "precision" in knobs else [None]
        floors = [
            self.compute_floor_s(cheapest | ({"precision": p} if p else {})) for p in precisions
        ]
        known = [floor for floor in floors if floor is not None]
        return min(known) if known else None

    def reference(self, baseline_fits: bool | None = None) -> Reference | None:
        """Where the HF defaults do not fit the budget (`baseline_fits`: as their trial
        measured; None: by their estimate), the guides' low-memory recipe on them, one saver
        at a time until the estimate fits: checkpointing with batch 1 and the effective batch
        by accumulation (the same training), then with an adapter a bf16 base, then a 4-bit
        one, where the space holds them. None where the defaults fit, or nothing is estimated,
        or the whole recipe is estimated over the budget too."""
        budget = self.info.memory_budget_gib
        if baseline_fits is None:
            found = self.estimate_gib(self.baseline)
            if found is None or found <= budget:
                return None
        elif baseline_fits:
            return None
        samples = effective_batch(self.baseline)
        steps = [
            (
                {"gradient_checkpointing": True, "batch_size": 1, "grad_accum": samples},
                f"checkpointing, batch 1 x {samples} accumulation",
            ),
            ({"torch_dtype": "bf16"}, "a bf16 base"),
            ({"quantization": "nf4"}, "a 4-bit (NF4) base"),
        ]
        # The base's savers only where the space searches them (an adapter's, on this device).
        searched = {k: self.space.knobs[k].choices for k in ADAPTER_KNOBS if k in self.space.knobs}
        steps = [
            (change, words)
            for change, words in steps
            if all(k not in ADAPTER_KNOBS or v in searched.get(k, ()) for k, v in change.items())
        ]
        params, recipe = dict(self.baseline), []
        for change, words in steps:
            params |= change
            recipe.append(words)
            found = self.estimate_gib(params)
            if found is not None and found <= budget:
                return Reference(params=params, recipe=", ".join(recipe))
        return None

    def _estimate(
        self, params: dict[str, Any], model: EstimatedModel | None = None
    ) -> Estimate | None:
        if model is None:
            parameters = catalogue_parameter_counts().get(self.model.name)
            model = EstimatedModel(
                self.model.config, self.info.task, self.info.seq_len, self.info.adapter, parameters
            )
        try:
            return estimate(
                model.config,
                task=model.task,
                seq_len=model.seq_len,
                params=params,
                device=self.device,
                parameters=model.parameters,
                devices=self.devices_per_trial,
                adapter=model.adapter,
            )
        except (UnknownShape, TypeError):  # a config of unexpected types: no estimate
            return None

    @property
    def estimate_limit_gib(self) -> float | None:
        """Past this estimate (`estimate_gib`) a proposal is skipped: the budget plus
        `estimate_margin`, at most what the device can give a trial (`_device_limit_gib`);
        None when skipping by estimate is off."""
        margin = self.config.estimate_margin
        if margin is None:
            return None
        return min(self.info.memory_budget_gib * (1 + margin), self._device_limit_gib)

    @property
    def estimate_limit_source(self) -> str:
        """What sets `estimate_limit_gib`, in words that follow the figure."""
        if self.estimate_limit_gib != self._device_limit_gib:
            return "memory_budget and estimate_margin allow"
        if self.device == "cuda":
            total = format_bytes(self.device_info.total_memory_bytes)
            return (
                f"the GPU can give a trial's allocator (its {total} less a CUDA context of "
                f"{format_bytes(CUDA_CONTEXT_BYTES)})"
            )
        return "this machine can give a trial (its free RAM less what the search keeps)"

    @property
    def _device_limit_gib(self) -> float:
        # The margin is for the estimate's error; past what the device holds it only buys an
        # OOM. On CPU the kernel's OOM killer then ends the trial, or the search. On CUDA the
        # budget caps PyTorch's allocator (the worker's set_per_process_memory_fraction), and a
        # trial's peak is the allocator's (max_memory_reserved): `estimate_gib` is compared on
        # that scale, without the context. The card holds the context besides (0.72 GiB on
        # Hopper; the default budget, the free memory the probe saw, has only the probe's
        # 0.52 out of it), so the allocator gets at most the card's memory less a context.
        if self.device == "cuda":
            return (self.device_info.total_memory_bytes - CUDA_CONTEXT_BYTES) / GIB
        return float("inf") if self.host_limit_bytes is None else self.host_limit_bytes / GIB

    @property
    def data_dir(self) -> Path | None:
        """Where the prepared data lies (`autotune.child.prepare_data`): one entry per
        fingerprint."""
        if self.info.data is None:
            return None
        return self.study_dir / DATA_CACHE / self.info.data["fingerprint"]

    @property
    def study_name(self) -> str:
        return self.info.study

    @property
    def versions(self) -> dict[str, str]:
        """What this process's trials run under; `info.versions` is the study's."""
        return conditions.installed_versions(self.device_info)

    @property
    def device(self) -> str:
        """`cuda` or `cpu`."""
        return self.info.device

    # The study's settings are `info`'s (what it is stored with); `config` holds what this run
    # does with it (n_trials, timeouts, workers, the sampler). The two below are never None in
    # a plan: only a study stored before they were lacks them.
    @property
    def devices_per_trial(self) -> int:
        """The ranks each trial trains on, resolved (`devices_per_trial=auto` is not)."""
        assert self.info.devices_per_trial is not None
        return self.info.devices_per_trial

    @property
    def trial_steps(self) -> int:
        """A trial's optimizer steps: its warm-up and its timed ones."""
        assert self.info.warmup_steps is not None and self.info.measure_steps is not None
        return self.info.warmup_steps + self.info.measure_steps


def make_plan(
    config: RunConfig, device_info: DeviceInfo, cluster: Cluster | None = None
) -> SearchPlan:
    """The plan for `config` on this device (with `executor=ray`, a node of `cluster`'s),
    every problem with it named at once (a ConfigError); `settle` finishes it for its
    study."""
    problems: list[str] = []
    device = device_info.resolve(config.device)
    model, task = _model_and_task(config, problems)
    facts = SoftwareFacts.from_probe(dataclasses.asdict(device_info))
    source = "trainer" if config.trainer else "data" if config.data else "synthetic"
    slots = _slots(config, device, device_info, cluster, problems)
    ranks = _ranks(config, slots)
    rules = sampling_rules(config, ranks, device, device_info, source, problems)
    problems += _devices_problems(config, ranks, device, trial_cores(slots))
    fitted_for = (model.config.get("model_type", ""), task) if model and task else None
    space = fitted_space(
        config, ranks, device, device_info, facts, rules, source, slots, problems, fitted_for
    )
    study_name = study_dir = data = data_info = None
    if model is not None:
        problems += input_problems(model, task, config.seq_len, facts)
        study_name, study_dir = _study_folder(config, model, device, problems)
        data, data_info = _data(config, model, problems)
    search_dir = Path.cwd()
    trainer = trainer_info(config.trainer, search_dir) if config.trainer else None
    device_name, available_bytes = _memory(config, device, device_info, slots, cluster, problems)
    if problems:
        raise ConfigError("\n".join(problems))
    assert model is not None and task and space is not None and study_name and study_dir
    info = _run_info(
        config,
        model,
        task,
        space,
        device_info,
        slots,
        ranks=ranks,
        study=study_name,
        device=device,
        device_name=device_name,
        memory_budget_bytes=int(config.memory_budget or available_bytes),
        data=data_info,
        trainer=trainer,
    )
    return SearchPlan(
        config=config,
        model=model,
        info=info,
        space=space,
        rules=rules,
        baseline=_baseline(ranks, device_info, rules, source),
        study_dir=study_dir,
        storage_url=config.storage or study_db_url(study_dir),
        device_info=device_info,
        slots=slots,
        data=data,
        search_dir=search_dir,
        host_limit_bytes=available_bytes if device == "cpu" else None,
    )


def check_before_probe(config: RunConfig) -> None:
    """Refuse, before the device probe (seconds to a minute), what needs no device facts: a
    model that cannot be found and an out= this user cannot make a study folder in, every
    problem named at once (a ConfigError). `make_plan` checks the rest."""
    problems: list[str] = []
    _model_and_task(config, problems)
    problems += out_problems(config.out)
    if problems:
        raise ConfigError("\n".join(problems))


def out_problems(out: Path) -> list[str]:
    """Why a study folder cannot be made inside `out` (none: it can): the nearest part of it
    that exists must be a folder this user may write into."""
    existing = Path(os.path.abspath(out.expanduser()))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [f"out={out}: {existing} is not a folder, so no study folder can be made in it"]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [
            f"out={out}: {existing} is not writable by this user, so no study folder can be "
            "made in it; use an out= folder of your own"
        ]
    return []


def _model_and_task(config: RunConfig, problems: list[str]) -> tuple[ModelSpec | None, str | None]:
    """The model `model=` names and the task it trains at; Nones, the problem added, when the
    model cannot be found."""
    try:
        model = resolve_model(config.model)
    except AutotuneError as exc:
        problems.append(str(exc))
        return None, None
    return model, model.default_task if config.task == "auto" else config.task


def _slots(
    config: RunConfig,
    device: str,
    device_info: DeviceInfo,
    cluster: Cluster | None,
    problems: list[str],
) -> list[Placement]:
    """What each worker owns (`assign`; on a cluster `cluster_slots`), problems added."""
    if config.executor == "ray":
        assert cluster is not None, "executor=ray plans on the cluster's facts"
        slots, slot_problems = cluster_slots(
            cluster,
            device,
            config.workers,
            config.devices_per_trial,
            config.nodes_per_trial,
            config.cpus_per_trial,
        )
    else:
        slots, slot_problems = assign(
            config.workers, config.devices, device, device_info, config.devices_per_trial
        )
    problems += slot_problems
    return slots


def _ranks(config: RunConfig, slots: list[Placement]) -> int:
    """`devices_per_trial` resolved: a worker's GPUs on cuda; auto is 1 on cpu."""
    if slots and slots[0].node_gpus:
        return slots[0].node_gpus * slots[0].nodes
    if slots and slots[0].on_cluster and config.devices_per_trial == "auto":
        return slots[0].nodes  # a rank on each of its nodes
    if slots and slots[0].cuda_indices:
        return len(slots[0].cuda_indices)
    return 1 if config.devices_per_trial == "auto" else int(config.devices_per_trial)


def _devices_problems(config: RunConfig, ranks: int, device: str, cores: int | None) -> list[str]:
    if ranks == 1 or device == "cuda":  # GPUs: one a rank, counted by `assign`
        return []
    if cores is not None and cores < ranks:
        return [
            f"devices_per_trial={ranks} with workers={config.workers}: a trial has {cores} "
            f"core(s) and each rank needs one; lower one of them"
        ]
    return []


def _study_folder(
    config: RunConfig, model: ModelSpec, device: str, problems: list[str]
) -> tuple[str, Path]:
    """The study's name and folder (inside `out=`, and this user's), problems added."""
    study_name = config.study or default_study_name(model.name, device, config.seq_len)
    study_dir = (config.out / study_name).resolve()
    problems += out_problems(config.out)
    if not study_dir.is_relative_to(config.out.resolve()):
        problems.append(f"study={study_name}: {study_dir} lies outside out={config.out}")
    try:  # before anything (the data cache first) is written into it
        check_owner(study_dir)
    except AutotuneError as exc:
        problems.append(str(exc))
    return study_name, study_dir


def _data(
    config: RunConfig, model: ModelSpec, problems: list[str]
) -> tuple[DataSpec | None, dict[str, Any] | None]:
    """The user's data and what the study stores of it (`data_spec`); Nones without `data=`,
    or with the problem added when it cannot be read."""
    if not config.data:
        return None, None
    try:
        return data_spec(config, model)
    except AutotuneError as exc:
        problems.append(str(exc))
        return None, None


def _memory(
    config: RunConfig,
    device: str,
    device_info: DeviceInfo,
    slots: list[Placement],
    cluster: Cluster | None,
    problems: list[str],
) -> tuple[str, int]:
    """The device's name and the memory each worker's trials can have (on a cluster, those
    that run at once on a node share its memory); with nothing left and no `memory_budget=`,
    the problem added."""
    cuda_indices = [i for s in slots for i in s.cuda_indices]
    sharing = len(slots)
    if cluster is not None and slots:
        sharing = min(sharing, trials_per_node(cluster, slots[0]))
        cuda_indices = list(range(slots[0].node_gpus))
    device_name, available_bytes = device_info.memory_for(device, cuda_indices, sharing)
    if not config.memory_budget and available_bytes <= 0:
        problems.append(_no_memory_left(device, device_info, len(slots)))
    return device_name, available_bytes


def _no_memory_left(device: str, device_info: DeviceInfo, workers: int) -> str:
    if device == "cuda":
        return "memory_budget: the GPU has no free memory; free it, or give memory_budget="
    available = format_bytes(device_info.host_available_memory_bytes)
    total = device_info.host_total_memory_bytes or device_info.host_available_memory_bytes
    kept = format_bytes(cpu_reserve_bytes(total, workers))
    return (
        f"memory_budget: {available} of RAM is available and a CPU search keeps {kept} for "
        "itself, its fork servers and the machine: nothing is left for a trial; free memory, "
        "use fewer workers, or give memory_budget= to take that risk"
    )


def _run_info(
    config: RunConfig,
    model: ModelSpec,
    task: str,
    space: SearchSpace,
    device_info: DeviceInfo,
    slots: list[Placement],
    *,
    ranks: int,
    study: str,
    device: str,
    device_name: str,
    memory_budget_bytes: int,
    data: dict[str, Any] | None,
    trainer: dict[str, str | None] | None,
) -> RunInfo:
    """What the study is run for, as it stores it."""
    return RunInfo(
        study=study,
        model=model.name,
        model_config=model.config,
        task=task,
        seq_len=config.seq_len,
        device=device,
        device_name=device_name,
        space=space.name,
        space_notes=list(space.notes),
        effective_batch_size=config.effective_batch_size,
        adapter=config.adapter(task),
        memory_budget_bytes=memory_budget_bytes,
        headroom=config.headroom,
        noise_cv=config.noise_cv,
        math_change_min_gain=config.math_change_min_gain,
        report_to=config.report_to,
        data=data,
        trainer=trainer,
        measure_steps=config.measure_steps,
        warmup_steps=config.warmup_steps,
        cores_per_trial=trial_cores(slots),
        devices_per_trial=ranks,
        versions=conditions.installed_versions(device_info),
        gpu_link=_gpu_link(device, device_info, slots),
        simulated=_simulated(config, device_info),
        training_fields=_training_fields(device_info),
    )


def _training_fields(device_info: DeviceInfo) -> tuple[str, ...] | None:
    """The installed fields the knobs' arguments are named by; None where none were read."""
    installed = set(device_info.training_argument_fields)
    return tuple(f for f in NAMING_FIELDS if f in installed) if installed else None


def _simulated(config: RunConfig, device_info: DeviceInfo) -> str | None:
    """What answers the trials of `executor=twin`, in words; None where they are measured."""
    if config.executor != "twin":
        return None
    return f"the GPU twin of {len(device_info.cuda_device_names)}x {device_info.name}"


def _gpu_link(device: str, device_info: DeviceInfo, slots: list[Placement]) -> str | None:
    """The slowest link between a trial's GPUs, in words (a worker's GPUs are its trials')."""
    if device != "cuda" or not slots:
        return None
    link = device_info.link_between(slots[0].cuda_indices)
    return None if link is None else link.describe()


def _baseline(
    ranks: int, device_info: DeviceInfo, rules: SamplingRules, source: str
) -> dict[str, object]:
    """The first trial: the HF default TrainingArguments as knobs, at a rank's effective batch."""
    return baseline_params(
        device_info.default_optim,
        rules.effective_batch_size,
        own_data=source != "synthetic",
        own_collator=source != "trainer",
        devices=ranks,
    )


def default_study_name(model_name: str, device: str, seq_len: int) -> str:
    """`gpt2`, `cuda`, 512 -> `gpt2-cuda-s512`; `/` in hub ids becomes `--`; at most
    STUDY_NAME_MAX_CHARS characters."""
    path = Path(model_name)
    stem = path.resolve().name if path.is_dir() else model_name.replace("/", "--")
    suffix = f"-{device}-s{seq_len}"
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", stem)[: STUDY_NAME_MAX_CHARS - len(suffix)]
    return stem + suffix
