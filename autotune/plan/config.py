"""The run configuration: typed, validated, with every default in one place.

`autotune search key=value ...` overrides are parsed Hydra-style: the value of a setting whose
type needs it is read as YAML (`n_trials=8` is an int, `quiet=true` a bool); a path, name or URL
(a setting typed `str` or `Path`) is the literal text typed (`data=#reviews.jsonl` is that file,
not a YAML comment), `null` or `~` alone meaning unset where the setting may be. pydantic
validates the result. Problems are collected and reported at once.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from autotune.common.errors import ConfigError
from autotune.common.models import resolve_offline
from autotune.common.user_data import did_you_mean

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_DURATION_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration_s(value: Any) -> Any:
    """`90`, `90s`, `20m`, `1h30m`, `250ms` -> seconds as a float; other input passes through."""
    if isinstance(value, str):
        text = value.strip().lower()
        parts = _DURATION_PART.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _DURATION_UNIT_S[u] for n, u in parts)
        raise ValueError("expected a duration such as 90s, 20m or 1h30m")
    return value


Duration = Annotated[float, BeforeValidator(parse_duration_s), Field(gt=0)]
Sampler = Literal["auto", "effects", "tpe", "gp", "nsga2", "random", "grid"]
Task = Literal["auto", "sequence-classification", "causal-lm", "masked-lm", "seq2seq"]
Device = Literal["auto", "cuda", "cpu"]


def check_workers(value: Any) -> Any:
    """`auto` or a whole number of processes, 1 or more (one message for anything else)."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError("expected auto or a number of processes, 1 or more")


Workers = Annotated[int | Literal["auto"], BeforeValidator(check_workers)]


def check_devices_per_trial(value: Any) -> Any:
    """`auto` or a whole number of ranks, 1 or more."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError("expected auto or a number of devices, 1 or more")


DevicesPerTrial = Annotated[int | Literal["auto"], BeforeValidator(check_devices_per_trial)]
MIN_STALE_AFTER_S = 3


def check_devices(value: str) -> str:
    """`auto`, or distinct device indices separated by commas (`0,1,3`)."""
    if value == "auto":
        return value
    if not re.fullmatch(r"\d+(,\d+)*", value):
        raise ValueError("expected auto or device indices separated by commas, e.g. 0,1,3")
    indices = value.split(",")
    if len(set(indices)) != len(indices):
        raise ValueError("a device is named twice (each worker owns its own)")
    return value


def check_study_name(value: str) -> str:
    problem = study_name_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def check_trainer_factory(value: str) -> str:
    """`module:function` or `path/to/file.py:function` (the function a Python name)."""
    where, sep, function = value.rpartition(":")
    if not sep or not where or not function.isidentifier():
        raise ValueError("expected module:function or path/to/file.py:function")
    if not where.endswith(".py") and not all(p.isidentifier() for p in where.split(".")):
        raise ValueError(f"{where!r} is neither a module name nor a .py file")
    return value


TrainerFactory = Annotated[str, AfterValidator(check_trainer_factory)]
Devices = Annotated[str, AfterValidator(check_devices)]
StudyName = Annotated[str, AfterValidator(check_study_name)]
"""A study name that names a folder inside `out=`."""


# The settings of each command, declared once: a setting two commands share lives in a group
# both inherit; one whose help differs per command (`timeout=`, `workers=`) shares its type,
# which holds its checks.
MemoryBudget = Annotated[ByteSize, Field(gt=0)]


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
        "text", description="data=: the column of text to tokenize (unused with input_ids)"
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
        "auto = default on cuda, cpu on cpu",
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
        "advice for the device at the largest batch that fits and a batch ladder, then a model "
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
    seed: int = Field(0, description="seed for the sampler, model init and synthetic data")
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
        return self

    @field_validator("stale_after")
    @classmethod
    def _stale_after_leaves_room_for_heartbeats(cls, value: float) -> float:
        if value < MIN_STALE_AFTER_S:
            raise ValueError(
                f"at least {MIN_STALE_AFTER_S}s: heartbeats come once a second at most"
            )
        return value


def check_report_to(value: str) -> str:
    """`value` when it names integrations (`wandb`, `tensorboard,mlflow`); raises otherwise:
    it is written into the exported script and its command line."""
    if not re.fullmatch(r"[a-z0-9_]+(,[a-z0-9_]+)*", value):
        raise ValueError(
            "expected integration names as TrainingArguments.report_to takes them, "
            "comma-separated: none, all, wandb, tensorboard, mlflow, ..."
        )
    return value


STUDY_NAME_MAX_CHARS = 100


def study_name_problem(name: str) -> str | None:
    """Why `name` cannot name a study folder inside `out=`, or None when it can."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        return "use letters, digits, '.', '_' and '-' only (it names a folder)"
    if name in (".", ".."):
        return "it names a folder inside out=, not out= itself or its parent"
    if len(name) > STUDY_NAME_MAX_CHARS:
        return f"at most {STUDY_NAME_MAX_CHARS} characters (it has {len(name)})"
    return None


NULL_WORDS = frozenset({"null", "Null", "NULL", "~"})
"""What YAML reads as null; alone, they unset an optional path, name or URL too."""


def _text_only(annotation: Any) -> tuple[bool, bool]:
    """(the setting takes text alone, it may be None) for a field's type: `str`, `Path`,
    `StudyName | None`, ... are text; `int | Literal["auto"]`, `Literal[...]`, numbers are not."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) is not Literal else ()
    if typing.get_origin(annotation) is Annotated:
        return _text_only(args[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        optional = len(inner) < len(args)
        return len(inner) == 1 and _text_only(inner[0])[0], optional
    return annotation in (str, Path), False


def _read_value(raw: str, field: FieldInfo | None) -> Any:
    """The typed value of one override: literal text for a path, name or URL (YAML would
    turn `#x` into null, `a: b` into a mapping, a newline into a space), YAML otherwise."""
    if field is not None:
        text, optional = _text_only(field.annotation)
        if text:
            return None if optional and raw.strip() in NULL_WORDS else raw
    try:
        return yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        return raw  # not YAML (e.g. `[8,`): let validation say what is expected


def parse_overrides(
    overrides: list[str], schema: type[BaseModel] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """`["a=1", "b=x"]` -> `({"a": 1, "b": "x"}, problems)`; each value typed as `schema`'s
    field of that name needs (`_read_value`); keys it lacks are read as YAML."""
    fields = schema.model_fields if schema is not None else {}
    values: dict[str, Any] = {}
    problems: list[str] = []
    seen: set[str] = set()
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(f"{item!r}: expected key=value")
            continue
        if key in seen:
            problems.append(f"{key}: given more than once")
            continue
        seen.add(key)
        values[key] = _read_value(raw, fields.get(key))
    return values, problems


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


PER_PROCESS_SETTINGS = frozenset(WorkerConfig.model_fields) - {"study", "trainer"} | {"storage"}
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


def load_config(overrides: list[str], schema: type[BaseModel] = RunConfig) -> Any:
    """Parse and validate command-line overrides into `schema` (RunConfig by default)."""
    values, problems = parse_overrides(overrides, schema)
    return make_config(values, schema, problems)


def make_config(
    values: dict[str, Any], schema: type[BaseModel] = RunConfig, problems: Sequence[str] = ()
) -> Any:
    """Validate settings given as Python values (the Python API) into `schema`; every problem
    is reported at once, as for the command line."""
    problems = list(problems)
    problems += [
        _unknown_key_problem(key, schema) for key in values if key not in schema.model_fields
    ]
    known = {k: v for k, v in values.items() if k in schema.model_fields}
    for key in [k for k, v in known.items() if isinstance(v, bool) and _numeric(schema, k)]:
        # pydantic reads True as 1 (`seq_len=True` from the API): a slip, never meant
        problems.append(f"{key}={known.pop(key)}: expected a number, not a boolean")
    try:
        config = schema(**known)
    except ValidationError as exc:
        problems += [_describe(error, values) for error in exc.errors()]
    if problems and schema is RunConfig:
        problems += _found_without_a_probe(known, problems)
    if problems:
        raise ConfigError(_format_problems(problems))
    return config


def _found_without_a_probe(values: dict[str, Any], found: list[str]) -> list[str]:
    """Beside the settings' own problems, the ones the plan would find next that need neither
    the device nor the hub: a seq_len past a bundled (or local) model's positions, a data file
    that is not there. So that one run names every problem it can."""
    problems = []
    name, seq_len = values.get("model"), values.get("seq_len")
    model = resolve_offline(name) if isinstance(name, str) else None
    limit = model.max_seq_len if model is not None else None
    if isinstance(seq_len, int) and limit is not None and seq_len > limit:
        problems.append(f"seq_len={seq_len}: {name} takes at most {limit} tokens")
    data = values.get("data")
    if isinstance(data, str) and data.startswith((".", "/", "~")):
        if not Path(data).expanduser().exists():
            problems.append(f"data={data}: no such file or folder{did_you_mean(Path(data))}")
    said = {p.split(":", 1)[0] for p in found}
    return [p for p in problems if p.split(":", 1)[0] not in said]


def _numeric(schema: type[BaseModel], key: str) -> bool:
    """Whether setting `key` takes a number (int, float, a size, a duration) and no boolean."""
    annotation = schema.model_fields[key].annotation
    kinds = typing.get_args(annotation) or (annotation,)
    kinds = [typing.get_args(k)[0] if typing.get_origin(k) is Annotated else k for k in kinds]
    if bool in kinds:
        return False
    return any(isinstance(k, type) and issubclass(k, int | float) for k in kinds)


def _unknown_key_problem(key: str, schema: type[BaseModel]) -> str:
    close = difflib.get_close_matches(key, schema.model_fields, n=1, cutoff=0.6)
    if schema is WorkerConfig:  # a worker's few keys, said; a search's come from the study
        takes = ", ".join(WorkerConfig.model_fields)
        hint = f"did you mean {close[0]}? " if close else ""
        return (
            f"{key}: not a setting of autotune worker: {hint}a worker takes {takes}; the "
            "model and the search's other settings come from the study"
        )
    hint = f"; did you mean {close[0]}?" if close else "; see --help"
    return f"{key}: unknown key{hint}"


def _describe(error: dict[str, Any], values: dict[str, Any]) -> str:
    key = ".".join(str(p) for p in error["loc"])
    if error["type"] == "missing":
        return f"{key}: required, e.g. {key}={_example(key)}"
    if error["type"].startswith("byte_size"):
        expected = "expected a size such as 24GiB, 512MiB or 80GB"
    else:
        expected = error["msg"].removeprefix("Value error, ").replace("Input should be", "expected")
    if not key:  # a check across settings: its message names them
        return expected
    given = values.get(key, error.get("input"))
    return f"{key}={given}: {expected}"


def _example(key: str) -> str:
    return {"model": "bert-large-uncased"}.get(key, "...")


def _format_problems(problems: list[str]) -> str:
    noun = "problem" if len(problems) == 1 else "problems"
    return f"{len(problems)} {noun} in the run configuration:\n" + "\n".join(
        f"  - {p}" for p in problems
    )


def help_rows(schema: type[BaseModel] = RunConfig) -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every setting, in declaration order."""
    rows = []
    for name, field in schema.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        kind = str(extra.get("metavar") or _type_name(field.annotation))
        default = "required" if field.is_required() else _show(field.default)
        rows.append((name, kind, default, field.description or ""))
    return rows


def _type_name(annotation: Any) -> str:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is Literal:
        return "|".join(args)
    if args:
        return _type_name(args[0])
    return getattr(annotation, "__name__", str(annotation)).upper()


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
