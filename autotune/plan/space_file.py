"""Search space files: YAML -> a validated `SearchSpace`, every problem at once with its line."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from autotune.common.errors import SpaceError
from autotune.common.knobs import KNOBS, SAMPLE_ORDER
from autotune.common.knobs import Knob as CatalogueKnob
from autotune.plan.space import (
    BASE_MULTIPLE,
    DEVICES,
    SMALL_BATCHES,
    TENSOR_CORE_MULTIPLE,
    Condition,
    SearchSpace,
    SpaceKnob,
)

PROBLEMS_SHOWN = 30
"""The problems of a space file listed at most; the rest are counted (a generated file of
200,000 bad choices would print 18 MB)."""


def shipped_dir() -> Path:
    """The shipped spaces: inside the installed wheel, or the repo's top-level folder."""
    in_wheel = Path(str(resources.files("autotune") / "search_spaces"))
    # The wheel copies the top-level search_spaces/ into the package; a source checkout or an
    # editable install has only the top-level folder.
    return in_wheel if in_wheel.is_dir() else Path(__file__).resolve().parents[2] / "search_spaces"


def shipped_names() -> list[str]:
    return sorted(p.stem for p in shipped_dir().glob("*.yaml"))


def space_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix:
        if not path.is_file():
            raise SpaceError(f"space={name_or_path}: file not found")
        return path
    path = shipped_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        raise SpaceError(
            f"space={name_or_path}: no such shipped space; "
            f"choose one of {', '.join(shipped_names())} or give a YAML path"
        )
    return path


@dataclass(frozen=True, kw_only=True, slots=True)
class SoftwareFacts:
    """Names the installed packages accept; None skips that check."""

    optimizer_names: tuple[str, ...] | None = None
    compile_backends: tuple[str, ...] | None = None
    model_types: tuple[str, ...] | None = None
    """`model_type` values the installed transformers can build."""
    task_model_types: dict[str, tuple[str, ...]] | None = None
    """Task -> the model types with that head in the installed transformers."""
    transformers_version: str = ""
    """Named in the messages about model types."""
    default_optim: str | None = None
    """`TrainingArguments().optim` in the installed transformers: the baseline's optimizer."""
    tp_model_types: tuple[str, ...] | None = None
    """The model types with a tensor-parallel plan (`strategy=tp`)."""
    training_argument_fields: tuple[str, ...] | None = None
    """The installed `TrainingArguments` fields (`knobs.training_args` names by them)."""

    @classmethod
    def from_probe(cls, software: Mapping[str, Any]) -> SoftwareFacts:
        """From the device probe's facts of the installed packages (`common.device.SOFTWARE_FACTS`:
        a `DeviceInfo` as a dict, or the software cache's record). An empty list is one the
        probe did not read, so its check is skipped."""
        tasks = software.get("task_model_types") or {}
        return cls(
            optimizer_names=tuple(software.get("optimizer_names") or ()) or None,
            compile_backends=tuple(software.get("compile_backends") or ()) or None,
            model_types=tuple(software.get("model_types") or ()) or None,
            task_model_types={task: tuple(types) for task, types in tasks.items()} or None,
            transformers_version=software.get("transformers_version") or "",
            default_optim=software.get("default_optim") or None,
            tp_model_types=tuple(software.get("tp_model_types") or ()) or None,
            training_argument_fields=tuple(software.get("training_argument_fields") or ()) or None,
        )


def load_space(name_or_path: str, facts: SoftwareFacts | None = None) -> SearchSpace:
    """A shipped space by name, or a YAML file by path; SpaceError names every problem."""
    path = space_path(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise SpaceError(
            f"{path}:{line}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start}); save the space as UTF-8 YAML"
        ) from exc
    except OSError as exc:
        raise SpaceError(f"{path}: cannot read it: {exc.strerror}") from exc
    try:
        node = yaml.compose(text)
        _check_size(node, path)  # before anything walks the values an alias may multiply
        data = yaml.safe_load(text)
        twice: list[str] = []
        lines = _key_lines(node, twice=twice)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SpaceError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    except RecursionError as exc:  # the YAML parser itself recurses per level
        raise SpaceError(
            f"{path}: nested too deep for the YAML parser; a space is a mapping of knobs, "
            f"each a value or a list of them ({MAX_DEPTH} levels at most)"
        ) from exc
    if twice:  # YAML keeps the last silently: a knob edited in one place, run from another
        raise SpaceError("\n".join(f"{path}:{where}" for where in twice))
    return parse_space(data, name=path.stem, source=str(path), lines=lines, facts=facts)


MAX_DEPTH = 16
"""Levels of nesting a space file may have (knobs -> knob -> choices -> value is four)."""
MAX_NODES = 100_000
"""Values a space file may expand to, its aliases followed (the shipped ones have a few
hundred): a YAML alias repeated inside the lists it names multiplies them."""


def _check_size(node: yaml.Node | None, path: Path) -> None:
    """SpaceError where the composed document, each alias expanded, nests deeper than
    `MAX_DEPTH` or expands to more than `MAX_NODES` values; walked without recursion and
    stopped at the cap, so that a file made to expand to billions is refused at once."""
    stack = [(node, 1)] if node is not None else []
    seen = 0
    while stack:
        current, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise SpaceError(
                f"{path}: expands to more than {MAX_NODES:,} values (an alias repeated inside "
                "the lists it names?); a space file holds a few hundred"
            )
        if depth > MAX_DEPTH:
            line = current.start_mark.line + 1
            raise SpaceError(
                f"{path}:{line}: nested more than {MAX_DEPTH} levels deep; a space is a "
                "mapping of knobs, each a value or a list of them"
            )
        if isinstance(current, yaml.SequenceNode):
            stack += [(child, depth + 1) for child in current.value]
        elif isinstance(current, yaml.MappingNode):
            stack += [(part, depth + 1) for pair in current.value for part in pair]


def _key_lines(node: yaml.Node | None, prefix: str = "", *, twice: list[str]) -> dict[str, int]:
    """Dotted key path -> 1-based line, for messages that point into the file; a key given
    twice in one mapping is added to `twice` as `LINE: PATH: ...`."""
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = f"{prefix}{key.value}"
            line = key.start_mark.line + 1
            if path in lines:
                twice.append(f"{line}: {path}: given twice (first on line {lines[path]}); keep one")
            lines[path] = line
            lines |= _key_lines(value, path + ".", twice=twice)
    return lines


def parse_space(
    data: Any,
    *,
    name: str,
    source: str,
    lines: dict[str, int] | None = None,
    facts: SoftwareFacts | None = None,
) -> SearchSpace:
    lines = lines or {}
    facts = facts or SoftwareFacts()
    problems: list[str] = []

    def problem(path: str, message: str) -> None:
        line = lines.get(path)
        problems.append(f"{source}:{line}: {path}: {message}" if line else f"{source}: {message}")

    if not isinstance(data, dict):
        raise SpaceError(f"{source}: expected a mapping with description, device and knobs")
    for key in sorted(set(data) - {"description", "device", "knobs"}):
        problem(key, "unknown top-level key (expected description, device, knobs)")
    device = data.get("device", "any")
    if device not in DEVICES:
        problem("device", f"{device!r} is not one of {', '.join(DEVICES)}")
    raw_knobs = data.get("knobs")
    if not isinstance(raw_knobs, dict) or not raw_knobs:
        problem("knobs", "expected a mapping of knob name -> values")
        raw_knobs = {}
    knobs: dict[str, SpaceKnob] = {}
    for knob_name, spec in raw_knobs.items():
        path = f"knobs.{knob_name}"
        if knob_name not in KNOBS:
            close = difflib.get_close_matches(str(knob_name), KNOBS, n=1, cutoff=0.75)
            hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(KNOBS)}"
            problem(path, f"unknown knob ({hint})")
            continue
        try:
            knobs[knob_name] = _parse_knob(knob_name, spec, facts)
        except ValueError as exc:
            for message in str(exc).split("\n"):
                problem(path, message)
    for knob in knobs.values():
        for message in _condition_problems(knob, knobs):
            problem(f"knobs.{knob.name}", message)
    if problems:
        shown = [f"  - {p}" for p in problems[:PROBLEMS_SHOWN]]
        if len(problems) > PROBLEMS_SHOWN:
            shown.append(
                f"  - ... and {len(problems) - PROBLEMS_SHOWN:,} more: fix these "
                f"{PROBLEMS_SHOWN} and validate again"
            )
        raise SpaceError(f"{len(problems):,} problem(s) in {source}:\n" + "\n".join(shown))
    return SearchSpace(
        name=name,
        description=str(data.get("description", "")),
        device=device,
        knobs=knobs,
        source=source,
    )


def _parse_knob(name: str, spec: Any, facts: SoftwareFacts) -> SpaceKnob:
    kind = KNOBS[name]
    if not isinstance(spec, dict):
        spec = {"choices": [spec]}
    spec = dict(spec)
    when = _parse_when(spec.pop("when", None))
    multiple_of = spec.pop("multiple_of", BASE_MULTIPLE if name == "batch_size" else None)
    if multiple_of is not None and name != "batch_size":
        raise ValueError("multiple_of applies to batch_size only")
    if multiple_of != "auto" and multiple_of is not None and not _positive_int(multiple_of):
        raise ValueError(f"multiple_of: {multiple_of!r} is not a positive integer or auto")
    if "choices" in spec:
        if set(spec) != {"choices"}:
            raise ValueError("`choices` cannot be combined with low/high/step/log")
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise ValueError("choices must be a non-empty list")
        nested = [i for i, v in enumerate(choices, 1) if isinstance(v, (list, dict))]
        if nested:  # said without its value, which may be enormous
            raise ValueError(
                f"choices must be values (a number, a string, true or false): item "
                f"{nested[0]} is a {type(choices[nested[0] - 1]).__name__}"
            )
        is_range = False
    elif kind.ranges and {"low", "high"} <= set(spec) <= {"low", "high", "step", "log"}:
        choices = _expand_range(spec)
        is_range = True
    else:
        form = "`low:`, `high:` (optional `step:`, `log:`), " if kind.ranges else ""
        raise ValueError(f"expected {form}`choices: [...]` or a single value")
    choices = [normalise_value(name, v) for v in choices]
    errors = [f"{v!r} is not {kind.expected}" for v in choices if not _valid(kind, v)]
    for v in choices:
        # A hint (the closest name) for as many as are shown: difflib on each of a generated
        # file's 90,000 bad names took a minute.
        hinted = len(errors) < PROBLEMS_SHOWN
        if _valid(kind, v) and (problem := known_name_problem(name, v, facts, hint=hinted)):
            errors.append(problem)
    if len(set(map(repr, choices))) != len(choices):
        errors.append(f"choices repeat a value: {choices}")
    if name == "batch_size" and not errors:
        errors += _batch_rule_problems(choices, multiple_of, is_range)
    if errors:
        raise ValueError("\n".join(errors))
    return SpaceKnob(
        name=name,
        choices=tuple(choices),
        is_range=is_range,
        multiple_of=multiple_of,
        when=when,
    )


MAX_RANGE = 10_000
"""Values a `low:`/`high:` range may expand to."""


def _expand_range(spec: dict[str, Any]) -> list[int]:
    low, high, step, log = spec["low"], spec["high"], spec.get("step", 1), spec.get("log", False)
    if not all(_positive_int(v) or v == 0 for v in (low, high)) or not _positive_int(step):
        raise ValueError("low, high and step must be integers (low, high >= 0, step >= 1)")
    if high < low:
        raise ValueError(f"high ({high}) is below low ({low})")
    if not log and (high - low) // step + 1 > MAX_RANGE:
        raise ValueError(
            f"low {low} to high {high} by {step} is {(high - low) // step + 1:,} values; a "
            f"range may have {MAX_RANGE:,} at most (log: true walks powers of two)"
        )
    if log:  # powers of two between low and high: the usual way to walk batch sizes
        if low == 0 or step != 1:
            raise ValueError("log: true needs low >= 1 and no step")
        values = []
        value = low
        while value <= high:
            values.append(value)
            value *= 2
        return values
    return list(range(low, high + 1, step))


def normalise_value(name: str, value: Any) -> Any:
    """A knob's value as read from YAML (a space, `autotune estimate knob=value`) made the
    value the knob takes."""
    # YAML 1.1 reads a bare `off` as false; for torch_compile it means "no compile".
    return "off" if name == "torch_compile" and value is False else value


def _valid(kind: CatalogueKnob, value: Any) -> bool:
    # bool is an int in Python; a knob that wants integers must not accept `true`.
    type_ok = isinstance(value, kind.kind) and not (kind.kind is int and isinstance(value, bool))
    return type_ok and bool(kind.check(value))


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def known_name_problem(
    name: str, value: Any, facts: SoftwareFacts, *, hint: bool = True
) -> str | None:
    """Why the installed packages refuse this value of knob `name` (an optimizer or compile
    backend they do not offer), with the closest name they accept; None when they take it or
    `facts` does not know. A space's choices and `autotune estimate optim=...` are checked
    alike."""
    known = {"optim": facts.optimizer_names, "torch_compile": facts.compile_backends}.get(name)
    if known is None:
        return None
    allowed = set(known) | ({"off"} if name == "torch_compile" else set())
    if value in allowed:
        return None
    close = difflib.get_close_matches(str(value), sorted(allowed), n=1) if hint else []
    said = f"; did you mean {close[0]}?" if close else ""
    return f"{value!r} is not {KNOBS[name].expected} here{said}"


def _batch_rule_problems(choices: list[int], multiple_of: int | str, is_range: bool) -> list[str]:
    base = BASE_MULTIPLE if multiple_of == "auto" else multiple_of
    if is_range:
        values = [v for v in choices if v % base == 0]
        problems = [] if values else [f"no multiple of {base} between the range's low and high"]
        if multiple_of == "auto" and not any(v % TENSOR_CORE_MULTIPLE == 0 for v in choices):
            problems.append("multiple_of: auto needs a multiple of 64 in the range")
        return problems
    problems = [
        f"batch size {v} breaks the rule: use a multiple of {base} (or 1, 2, 4)"
        for v in choices
        if v % base and v not in SMALL_BATCHES
    ]
    if multiple_of == "auto" and not any(v % TENSOR_CORE_MULTIPLE == 0 for v in choices):
        problems.append("multiple_of: auto needs a multiple of 64 among the choices")
    return problems


def _parse_when(raw: Any) -> tuple[Condition, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise ValueError("when: expected a mapping such as {torch_compile: {not: off}}")
    conditions = []
    for knob, values in raw.items():
        negate = isinstance(values, dict)
        if negate:
            if set(values) != {"not"}:
                raise ValueError(f"when.{knob}: expected a value, a list, or {{not: ...}}")
            values = values["not"]
        values = values if isinstance(values, list) else [values]
        normalised = tuple(normalise_value(str(knob), v) for v in values)
        conditions.append(Condition(knob=str(knob), values=normalised, negate=negate))
    return tuple(conditions)


def _condition_problems(knob: SpaceKnob, knobs: dict[str, SpaceKnob]) -> list[str]:
    problems = []
    for required, need in KNOBS[knob.name].requires.items():
        other = knobs.get(required)
        met = callable(need) and other and any(need(v) for v in other.choices)
        if not met and (other is None or need not in other.choices):
            wanted = (
                f"{required} {need.words}"
                if callable(need)
                else (f"{required}={str(need).lower()}")
            )
            problems.append(f"takes effect only with {wanted}, which this space never chooses")
    for condition in knob.when:
        other = knobs.get(condition.knob)
        if condition.knob not in KNOBS:
            problems.append(f"when: {condition.knob} is not a knob")
        elif other is None:
            problems.append(f"when: {condition.knob} is not in this space, so it never holds")
        elif SAMPLE_ORDER.index(condition.knob) >= SAMPLE_ORDER.index(knob.name):
            problems.append(f"when: {condition.knob} is chosen after {knob.name}, not before")
        elif not any(condition.holds({condition.knob: v}) for v in other.choices):
            problems.append(
                f"when: no value of {condition.knob} ({', '.join(map(str, other.choices))}) "
                "satisfies it, so the knob is never used"
            )
    return problems
