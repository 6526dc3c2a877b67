"""Settings read into a command's schema (`autotune.plan.config`), every problem at once.

`autotune search key=value ...` overrides are parsed Hydra-style: the value of a setting whose
type needs it is read as YAML (`n_trials=8` is an int, `quiet=true` a bool); a path, name or URL
(a setting typed `str` or `Path`) is the literal text typed (`data=#reviews.jsonl` is that file,
not a YAML comment), `null` or `~` alone meaning unset where the setting may be. pydantic
validates the result. Problems are collected and reported at once: an unknown key with the
closest known one, a value with what is expected, and for a search the problems found without
a probe. Each command's `--help` rows come from its schema here too.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from autotune.common.errors import ConfigError
from autotune.common.models import resolve_offline
from autotune.common.user_data import did_you_mean
from autotune.plan.config import RunConfig, WorkerConfig

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
