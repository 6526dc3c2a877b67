"""The types of the settings' values, each with its check: durations (`20m`), worker and
device counts, device lists, study names, Trainer factory references, memory sizes and tracker
names. A check's message is what the user reads after `key=value: `.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, ByteSize, Field

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


def check_cpus(value: Any) -> Any:
    """`auto` or a whole number of CPUs, 1 or more."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError("expected auto or a number of CPUs, 1 or more")


Cpus = Annotated[int | Literal["auto"], BeforeValidator(check_cpus)]


def check_devices_per_trial(value: Any) -> Any:
    """`auto` or a whole number of ranks, 1 or more."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError("expected auto or a number of devices, 1 or more")


DevicesPerTrial = Annotated[int | Literal["auto"], BeforeValidator(check_devices_per_trial)]


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
MemoryBudget = Annotated[ByteSize, Field(gt=0)]


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


def check_report_to(value: str) -> str:
    """`value` when it names integrations (`wandb`, `tensorboard,mlflow`); raises otherwise:
    it is written into the exported script and its command line."""
    if not re.fullmatch(r"[a-z0-9_]+(,[a-z0-9_]+)*", value):
        raise ValueError(
            "expected integration names as TrainingArguments.report_to takes them, "
            "comma-separated: none, all, wandb, tensorboard, mlflow, ..."
        )
    return value
