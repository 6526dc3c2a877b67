"""The run configuration: typed, validated, with every default in one place.

Each command's settings are a schema here; the types of their values, with their checks, are
`autotune.plan.setting_types`, and reading settings into a schema (`key=value` overrides or
Python values, every problem reported at once) is `autotune.plan.overrides`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autotune.common.adapter import ALL_LINEAR, lora_config, parse_targets
from autotune.plan.setting_types import (
    Cpus,
    Device,
    Devices,
    DevicesPerTrial,
    Duration,
    MemoryBudget,
    Sampler,
    StudyName,
    Task,
    TrainerFactory,
    Workers,
    check_report_to,
)

MIN_STALE_AFTER_S = 3


# The settings of each command, declared once: a setting two commands share lives in a group
# both inherit; one whose help differs per command (`timeout=`, `workers=`) shares its type,
# which holds its checks.
class _Settings(BaseModel):
    """What every command's settings are: closed to unknown keys, frozen, and a number given
    where text is expected (a study named 2024) kept as text. Field descriptions are the
    `--help` text."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


class _ModelSettings(_Settings):
    """The model trained and its input: `autotune search` and `autotune estimate`."""

    model: str = Field(
        description="catalogue name (see `autotune models`), local folder with config.json, "
        "or hub id",
        json_schema_extra={"metavar": "NAME"},
    )
    task: Task = Field("auto", description="training head; auto picks it from the architecture")
    seq_len: int = Field(512, gt=0, description="tokens per sample")
    peft: Literal["none", "lora"] = Field(
        "none",
        description="lora: train LoRA adapters on a frozen base (peft's LoraConfig, the same in "
        "every trial and part of the study); the base's dtype and a quantized base (QLoRA) "
        "are then searched; none = a full fine-tune",
    )
    lora_r: int = Field(16, gt=0, description="peft=lora: the adapters' rank")
    lora_alpha: int = Field(32, gt=0, description="peft=lora: the adapters' scale numerator")
    lora_dropout: float = Field(
        0.05, ge=0, lt=1, description="peft=lora: dropout on the adapters' input"
    )
    lora_target: str = Field(
        ALL_LINEAR,
        description="peft=lora: the modules that get adapters: all-linear (every linear "
        "layer but the output head) or names, e.g. q_proj,v_proj",
        json_schema_extra={"metavar": "NAMES"},
    )

    @field_validator("lora_target")
    @classmethod
    def _lora_target_is_module_names(cls, value: str) -> str:
        parse_targets(value)  # raises ValueError naming what is wrong
        return value

    @model_validator(mode="after")
    def _lora_settings_need_lora(self) -> _ModelSettings:
        given = sorted(
            k
            for k in self.model_fields_set
            if k.startswith("lora_") and getattr(self, k) != type(self).model_fields[k].default
        )
        if given and self.peft != "lora":
            raise ValueError(
                f"{', '.join(k + '=' for k in given)} without peft=lora: the settings are "
                "the LoRA adapters'; add peft=lora"
            )
        return self

    def adapter(self, task: str) -> dict[str, Any] | None:
        """peft's LoraConfig kwargs for the job at `task`; None: a full fine-tune."""
        if self.peft != "lora":
            return None
        return lora_config(
            r=self.lora_r,
            alpha=self.lora_alpha,
            dropout=self.lora_dropout,
            targets=parse_targets(self.lora_target),
            task=task,
        )


class _StoredStudy(_Settings):
    """Which study to read: `autotune report`, `export` and `confirm`."""

    storage: str | None = Field(None, description="Optuna storage URL; null = STUDY_DIR/study.db")
    study: str | None = Field(None, description="study name in the storage; null = its only one")


class RunConfig(_ModelSettings):
    """Everything one `autotune search` needs."""

    data: str | None = Field(
        None,
        description="your data: json/jsonl/csv/parquet/text files, a folder of them, a "
        "save_to_disk folder or a hub id; tokenized once per study, truncated at seq_len, "
        "padded per batch; null = random tokens of seq_len (nothing to load)",
        json_schema_extra={"metavar": "PATH|ID"},
    )
    data_split: str = Field("train", description="data=: the split to train on")
    text_column: str = Field(
        "text",
        description="data=: the column of text (or of chat turns) to tokenize; without it, "
        "a messages column or prompt and completion columns (unused with input_ids)",
    )
    tokenizer: str | None = Field(
        None,
        description="data=: a folder saved with save_pretrained, or a hub id; null = model's",
        json_schema_extra={"metavar": "PATH|ID"},
    )
    trainer: TrainerFactory | None = Field(
        None,
        description="your own Trainer: module:function or path/to/file.py:function, called "
        "as function(args: TrainingArguments, model_kwargs: dict) -> Trainer with the tuned "
        "arguments; its model, data and collator are timed",
        json_schema_extra={"metavar": "MODULE:FUNCTION"},
    )
    device: Device = Field("auto", description="where trials run; auto = cuda if present")
    space: str = Field(
        "auto",
        description="search space: a shipped name (see search_spaces/) or a YAML path; "
        "auto = default on cuda (lora with peft=lora), cpu on cpu",
        json_schema_extra={"metavar": "NAME|PATH"},
    )
    effective_batch_size: int | None = Field(
        None,
        gt=0,
        description="fix batch_size x grad_accum to this (grad_accum derived); "
        "null = grad_accum as the space says",
    )
    n_trials: int = Field(
        20,
        gt=0,
        description="trials in the study, finished ones included; skipped ones "
        "(not run) do not count",
    )
    timeout: Duration | None = Field(
        None,
        description="stop starting trials after this long (e.g. 20m); null = no limit",
        json_schema_extra={"metavar": "DURATION"},
    )
    trial_timeout: Duration = Field(
        600.0,
        description="kill a trial after this long (e.g. 5m)",
        json_schema_extra={"metavar": "DURATION"},
    )
    force: bool = Field(
        False,
        description="run a search even when every trial's least compute is over "
        "trial_timeout (without it, such a search is refused before anything runs)",
    )
    compile_timeout: Duration = Field(
        600.0,
        description="extra time a torch.compile trial gets for compiling (e.g. 10m)",
        json_schema_extra={"metavar": "DURATION"},
    )
    warmup_steps: int = Field(3, ge=1, description="untimed optimizer steps before measuring")
    measure_steps: int = Field(10, ge=2, description="timed optimizer steps per trial")
    memory_budget: MemoryBudget | None = Field(
        None,
        description="memory a trial may use, e.g. 24GiB: past it the trial is oom; "
        "null = the device's free memory when the study is made (on CPU less what the search "
        "and the machine keep; stored with the study)",
        json_schema_extra={"metavar": "SIZE"},
    )
    headroom: float = Field(
        0.1, ge=0, lt=1, description="recommend only configs below budget x (1 - headroom)"
    )
    estimate_margin: float | None = Field(
        0.25,
        ge=0,
        description="skip a trial whose memory estimate, calibrated on the study's own "
        "trials, exceeds the budget by more than this share (never past what the device can "
        "give a trial: on CPU its free RAM, on a GPU its memory less a CUDA context); "
        "null = never skip by estimate",
    )
    sampler: Sampler = Field(
        "auto",
        description="how trials are chosen; auto = effects: the baseline, the guides' "
        "advice for the device (on a CPU, what was measured there) at the largest batch that "
        "fits and costs at most 3 baseline trials, and a batch ladder, then a model "
        "of each knob's effect weighing each trial's gain by its predicted time, compiling "
        "last (benchmarks/replay.py); tpe (multivariate), gp, nsga2, random and grid are "
        "Optuna's",
    )
    early_stop: bool = Field(
        True,
        description="stop a trial after 3 timed steps when even its fastest step is under "
        "half the fastest trial's pace so far; recorded as stopped with what it measured, "
        "never recommended (one process a trial only)",
    )
    min_gain_per_minute: float = Field(
        0.001,
        ge=0,
        allow_inf_nan=False,
        description="sampler=auto stops the search by itself when no untried setting is "
        "expected (by its model) to gain this share of samples/s per minute of its trial: "
        "0.001 breaks even on a training run of about 17 hours; 0 = run every trial",
    )
    noise_cv: float = Field(
        0.1, gt=0, description="flag a trial as noisy when its step-time CV is above this"
    )
    confirm_rounds: int = Field(
        3,
        ge=0,
        description="after the search, measure the baseline and the picks again this many "
        "times, interleaved, each in a fresh trial process; speedups are then the confirmed "
        "ones; 0 = no confirmation",
    )
    math_change_min_gain: float = Field(
        1.10,
        ge=1,
        description="recommend a trial that changes the training (batch, precision, "
        "optimizer) over the fastest one that keeps it only when it is this much faster, "
        "clear of the noise",
    )
    peak_tflops: float | None = Field(
        None,
        gt=0,
        description="the device's dense 16-bit peak TFLOP/s, MFU's denominator, for devices "
        "not in the built-in table; null = look the device up",
    )
    seed: int = Field(
        0,
        ge=0,
        lt=2**31,
        description="seed for the sampler, model init and synthetic data (0 to 2**31-1: "
        "numpy takes one below 2**32, and each rank of a trial adds its rank)",
    )
    quiet: bool = Field(False, description="print only errors and the paths written")
    study: StudyName | None = Field(
        None,
        description="study name (letters, digits, . _ -; at most 100); "
        "null = derived from model, device and seq_len",
    )
    out: Path = Field(Path("reports"), description="folder holding one subfolder per study")
    storage: str | None = Field(
        None,
        description="Optuna storage URL (postgresql://... for several hosts); "
        "null = sqlite file study.db in the study folder",
    )
    workers: Workers = Field(
        "auto",
        description="search processes sharing the study, each running its own trials; on "
        "cuda each owns devices_per_trial devices of devices=, on cpu each gets its share of "
        "the cores; auto = as many as the devices give on cuda, 1 on cpu",
        json_schema_extra={"metavar": "N|auto"},
    )
    devices: Devices = Field(
        "auto",
        description="cuda: the devices workers use, as indices among the visible ones (e.g. "
        "0,1,3); auto = every visible GPU",
        json_schema_extra={"metavar": "LIST|auto"},
    )
    devices_per_trial: DevicesPerTrial = Field(
        "auto",
        description="ranks one trial trains on, sharing it as the searched strategy says "
        "(ddp, fsdp, zero3, ...): on cuda one GPU each, on cpu a process each with its share "
        "of the trial's cores; auto = on cuda every device of a worker's share of devices= "
        "(1 with workers=auto), 1 on cpu",
        json_schema_extra={"metavar": "N|auto"},
    )
    executor: Literal["local", "ray", "twin"] = Field(
        "local",
        description="what runs the trials: local = worker processes of this host; ray = tasks "
        "on a Ray cluster's nodes (pip install 'autotune[ray]'), the study on this host; twin "
        "= the GPU twin answers each trial as gpu= would run it (a performance model, no GPU "
        "needed; the study is marked simulated)",
    )
    gpu: str | None = Field(
        None,
        description="executor=twin: the GPU the twin plays (H100, H200, A100-80GB, V100-32GB, "
        "L4, L40S, A10G, RTX 4090, TITAN RTX)",
        json_schema_extra={"metavar": "NAME"},
    )
    gpu_count: int = Field(
        1, ge=1, description="executor=twin: the GPUs of gpu= on the simulated host"
    )
    ray_address: str = Field(
        "auto",
        description="executor=ray: the cluster, as ray.init reads it: auto (RAY_ADDRESS, else "
        "the cluster this host runs), or HOST:PORT of its head",
        json_schema_extra={"metavar": "auto|HOST:PORT"},
    )
    nodes_per_trial: int = Field(
        1,
        ge=1,
        description="executor=ray: the nodes one trial's ranks are spread over, "
        "devices_per_trial/nodes_per_trial on each (a trial across nodes: torchrun's "
        "environment, gloo on cpu, NCCL on cuda)",
    )
    cpus_per_trial: Cpus = Field(
        "auto",
        description="executor=ray: the CPUs a trial takes on each of its nodes; auto = on cuda "
        "the node's share for its GPUs, on cpu every CPU of the smallest node",
        json_schema_extra={"metavar": "N|auto"},
    )
    stale_after: Duration = Field(
        60.0,
        description="a running trial whose search sent no heartbeat for this long (it died, "
        "or its host was lost) is failed by another worker and its settings run again",
        json_schema_extra={"metavar": "DURATION"},
    )
    report_to: str = Field(
        "none",
        description="experiment trackers the exported script logs the real run to "
        "(TrainingArguments.report_to: none, all, wandb, tensorboard, mlflow, ...; "
        "comma-separated); trials never log",
        json_schema_extra={"metavar": "NAMES"},
    )

    @field_validator("report_to")
    @classmethod
    def _report_to_is_integration_names(cls, value: str) -> str:
        return check_report_to(value)

    @model_validator(mode="after")
    def _one_source_of_data(self) -> RunConfig:
        if self.trainer and (self.data or self.tokenizer):
            given = "data=" if self.data else "tokenizer="
            raise ValueError(
                f"{given} with trainer=: the factory's Trainer brings its own data and "
                "tokenizer; give one or the other"
            )
        if self.tokenizer and not self.data:
            raise ValueError("tokenizer= without data=: the tokenizer is for data=")
        if self.trainer and self.peft != "none":
            raise ValueError(
                f"peft={self.peft} with trainer=: the factory builds its own model; apply the "
                "adapter there (get_peft_model), and autotune reads it from the Trainer's model"
            )
        return self

    @model_validator(mode="after")
    def _twin_settings_need_the_twin(self) -> RunConfig:
        if self.executor != "twin":
            given = [
                f"{name}={getattr(self, name)}"
                for name, default in (("gpu", None), ("gpu_count", 1))
                if getattr(self, name) != default
            ]
            if given:
                raise ValueError(
                    f"{' and '.join(given)}: for executor=twin, which simulates that GPU; "
                    f"executor={self.executor} measures the device at hand"
                )
            return self
        if self.gpu is None:
            raise ValueError("executor=twin needs gpu=NAME: the GPU the twin plays (e.g. H100)")
        if self.device == "cpu":
            raise ValueError("executor=twin with device=cpu: the twin simulates a GPU")
        if self.trainer:
            raise ValueError(
                "trainer= with executor=twin: the twin models the model= config autotune "
                "builds, not a factory's Trainer"
            )
        return self

    @model_validator(mode="after")
    def _cluster_settings_need_a_cluster(self) -> RunConfig:
        if self.executor == "ray":
            if self.trainer:
                raise ValueError(
                    "trainer= with executor=ray: a factory's file lies on this host, and the "
                    "cluster's nodes share no folder with it; run the factory with "
                    "executor=local, or with autotune worker on each host"
                )
            return self
        given = [
            f"{name}={getattr(self, name)}"
            for name, default in (("nodes_per_trial", 1), ("cpus_per_trial", "auto"))
            if getattr(self, name) != default
        ]
        if given:
            raise ValueError(
                f"{' and '.join(given)}: for executor=ray, which places a trial on a "
                "cluster's nodes; executor=local runs it on this host"
            )
        return self

    @field_validator("stale_after")
    @classmethod
    def _stale_after_leaves_room_for_heartbeats(cls, value: float) -> float:
        if value < MIN_STALE_AFTER_S:
            raise ValueError(
                f"at least {MIN_STALE_AFTER_S}s: heartbeats come once a second at most"
            )
        return value


class ExportConfig(_StoredStudy):
    """`autotune export STUDY_DIR key=value ...`"""

    format: Literal["json", "yaml", "py", "cli"] = Field(
        "json",
        description="json/yaml: TrainingArguments kwargs; py: a runnable script; "
        "cli: flags for the HF example scripts",
    )
    trial: int | None = Field(None, ge=0, description="trial number; null = the recommended one")
    report_to: str | None = Field(
        None,
        description="py: experiment trackers the script logs to; null = the study's report_to",
    )

    @field_validator("report_to")
    @classmethod
    def _report_to_is_integration_names(cls, value: str | None) -> str | None:
        return None if value is None else check_report_to(value)


class WorkerConfig(_Settings):
    """`autotune worker key=value ...`: join a study another search made; everything else
    (model, space, n_trials, ...) comes from the study."""

    study: StudyName | None = Field(
        None, description="the study to join; null = the storage's only one"
    )
    storage: str | None = Field(
        None, description="Optuna storage URL; null = sqlite file OUT/STUDY/study.db"
    )
    out: Path = Field(
        Path("reports"), description="folder whose STUDY subfolder holds this host's trial files"
    )
    workers: Workers = Field(
        "auto",
        description="search processes on this host; auto = one per device on cuda, 1 on cpu",
        json_schema_extra={"metavar": "N|auto"},
    )
    devices: Devices = Field(
        "auto",
        description="cuda: the devices workers use, one each (e.g. 0,1); auto = every visible GPU",
        json_schema_extra={"metavar": "LIST|auto"},
    )
    timeout: Duration | None = Field(
        None,
        description="stop starting trials after this long (e.g. 2h); null = until the study "
        "has its n_trials",
        json_schema_extra={"metavar": "DURATION"},
    )
    trainer: TrainerFactory | None = Field(
        None,
        description="run this Trainer factory (module:function or path/to/file.py:function, "
        "the same function the study names) instead of the file the study names, which is "
        "run only when its content is the one the search checked; null = the study's",
        json_schema_extra={"metavar": "MODULE:FUNCTION"},
    )
    quiet: bool = Field(False, description="print only errors")


PER_PROCESS_SETTINGS = frozenset(WorkerConfig.model_fields) - {"study", "trainer"} | {
    "storage",
    "executor",
    "ray_address",
    "gpu",
    "gpu_count",
}
"""Settings each process sets for itself; the others are the study's (stored with it). A
worker's own `trainer=` stands in for the study's, which is stored."""


class EstimateConfig(_ModelSettings):
    """`autotune estimate model=NAME key=value ... [knob=value ...]`"""

    device: Device = Field(
        "auto", description="cuda adds its context; auto = cuda if NVML sees a GPU"
    )
    memory_budget: MemoryBudget | None = Field(
        None,
        description="the memory to fit, e.g. 24GiB; null = the device's free memory now",
        json_schema_extra={"metavar": "SIZE"},
    )
    max_batch_size: int = Field(
        4096, gt=0, description="the largest batch size the table goes up to"
    )
    devices_per_trial: int = Field(
        1, ge=1, description="ranks a trial trains on: the figures are one rank's, by strategy="
    )
    gpu: str | None = Field(
        None,
        description="plan for a GPU not in hand, by name (H100, A100-80GB, L4, ...): its "
        "memory is the budget, unless memory_budget= is given",
    )


class ReportConfig(_StoredStudy):
    """`autotune report STUDY_DIR key=value ...`"""


class ConfirmConfig(ReportConfig):
    """`autotune confirm STUDY_DIR key=value ...`"""

    rounds: int = Field(
        3, ge=1, le=20, description="times each pick runs again, interleaved with the others"
    )
    quiet: bool = Field(False, description="print only errors")


class VerifyConfig(ReportConfig):
    """`autotune verify STUDY_DIR key=value ...`"""

    trial: int | None = Field(None, ge=0, description="trial number; null = the recommended one")
    steps: int = Field(
        200,
        ge=2,
        le=100_000,
        description="optimizer steps to train, the study's warm-up steps included",
    )
    quiet: bool = Field(False, description="print only errors")
