"""Search spaces: YAML -> validated knobs -> Optuna distributions. The only module that makes them.

A space file looks like

    description: one line shown by `autotune spaces`
    device: cpu                      # cpu | cuda | any
    knobs:
      batch_size: {choices: [8, 16, 32]}
      grad_accum: {low: 1, high: 4}  # integers; `step:` and `log: true` allowed
      precision: fp32                # a plain value fixes the knob

Every problem in a file is reported at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from autotune.errors import SpaceError

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
# Knob -> (value type, extra check on one value, what the check expects).
KNOBS: dict[str, tuple[type, Any, str]] = {
    "batch_size": (int, lambda v: v > 0, "a positive integer"),
    "grad_accum": (int, lambda v: v > 0, "a positive integer"),
    "gradient_checkpointing": (bool, lambda v: True, "true or false"),
    "precision": (str, lambda v: v in PRECISIONS, "one of " + ", ".join(PRECISIONS)),
    "optim": (str, lambda v: bool(v), "an optimizer name of TrainingArguments.optim"),
    "dataloader_num_workers": (int, lambda v: v >= 0, "an integer >= 0"),
}
DEVICES = ("cpu", "cuda", "any")


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    name: str
    description: str
    device: str
    distributions: dict[str, BaseDistribution]
    """Knobs the sampler chooses."""
    fixed: dict[str, Any]
    """Knobs with one value."""

    def complete(self, sampled: dict[str, Any]) -> dict[str, Any]:
        """Sampled values plus the fixed ones, in the space's knob order."""
        values = {**self.fixed, **sampled}
        return {k: values[k] for k in KNOBS if k in values}


def shipped_dir() -> Path:
    """The shipped spaces: inside the installed wheel, or the repo's top-level folder."""
    in_wheel = Path(str(resources.files("autotune") / "search_spaces"))
    # The wheel copies the top-level search_spaces/ into the package; a source checkout or an
    # editable install has only the top-level folder.
    return in_wheel if in_wheel.is_dir() else Path(__file__).resolve().parents[1] / "search_spaces"


def shipped_names() -> list[str]:
    return sorted(p.stem for p in shipped_dir().glob("*.yaml"))


def load_space(name_or_path: str) -> SearchSpace:
    """A shipped space by name, or a YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = shipped_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            raise SpaceError(
                f"space={name_or_path}: no such shipped space; "
                f"choose one of {', '.join(shipped_names())} or give a YAML path"
            )
    if not path.is_file():
        raise SpaceError(f"space={name_or_path}: file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpaceError(f"{path}: not valid YAML: {exc}") from exc
    return parse_space(data, name=path.stem, source=str(path))


def parse_space(data: Any, *, name: str, source: str) -> SearchSpace:
    problems: list[str] = []
    if not isinstance(data, dict):
        raise SpaceError(f"{source}: expected a mapping with description, device and knobs")
    for key in sorted(set(data) - {"description", "device", "knobs"}):
        problems.append(f"{key}: unknown top-level key (expected description, device, knobs)")
    device = data.get("device", "any")
    if device not in DEVICES:
        problems.append(f"device: {device!r} is not one of {', '.join(DEVICES)}")
    knobs = data.get("knobs")
    if not isinstance(knobs, dict) or not knobs:
        problems.append("knobs: expected a mapping of knob name -> values")
        knobs = {}
    distributions: dict[str, BaseDistribution] = {}
    fixed: dict[str, Any] = {}
    for knob, spec in knobs.items():
        if knob not in KNOBS:
            problems.append(f"knobs.{knob}: unknown knob (known: {', '.join(KNOBS)})")
            continue
        try:
            value = _parse_knob(knob, spec)
        except ValueError as exc:
            problems.append(f"knobs.{knob}: {exc}")
            continue
        if isinstance(value, BaseDistribution):
            distributions[knob] = value
        else:
            fixed[knob] = value
    if problems:
        raise SpaceError(
            f"{source}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems)
        )
    return SearchSpace(
        name=name,
        description=str(data.get("description", "")),
        device=device,
        distributions=distributions,
        fixed=fixed,
    )


def _parse_knob(knob: str, spec: Any) -> BaseDistribution | Any:
    kind, check, expected = KNOBS[knob]
    if not isinstance(spec, dict):
        _check_value(spec, kind, check, expected)
        return spec
    if "choices" in spec:
        choices = spec["choices"]
        if set(spec) != {"choices"}:
            raise ValueError("`choices` cannot be combined with other keys")
        if not isinstance(choices, list) or not choices:
            raise ValueError("choices must be a non-empty list")
        for value in choices:
            _check_value(value, kind, check, expected)
        if len(set(choices)) != len(choices):
            raise ValueError(f"choices repeat a value: {choices}")
        return CategoricalDistribution(choices) if len(choices) > 1 else choices[0]
    if kind is not int:
        raise ValueError(f"expected `choices: [...]` or a single value ({expected})")
    unknown = set(spec) - {"low", "high", "step", "log"}
    if unknown or not {"low", "high"} <= set(spec):
        raise ValueError("expected `choices: [...]` or `low:`, `high:` (optional `step:`, `log:`)")
    low, high, step, log = spec["low"], spec["high"], spec.get("step", 1), spec.get("log", False)
    for value in (low, high):
        _check_value(value, kind, check, expected)
    if high < low:
        raise ValueError(f"high ({high}) is below low ({low})")
    if log and step != 1:
        raise ValueError("log: true cannot be combined with step")
    return IntDistribution(low, high, log=bool(log), step=step)


def _check_value(value: Any, kind: type, check: Any, expected: str) -> None:
    # bool is an int in Python; a knob that wants integers must not accept `true`.
    type_ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not type_ok or not check(value):
        raise ValueError(f"{value!r} is not {expected}")
