"""What the installed torch and transformers offer, imported on first use: unit tests of modules
that never import them (the knob catalogue, the space, the exports) check their mapping
against the real packages without every unit test paying for the import at collection."""

import dataclasses
import functools
import importlib
from types import ModuleType
from typing import Any

from autotune.plan.space_file import SoftwareFacts


class Lazy:
    """A module imported on the first use of one of its names, not at collection: the unit
    tests of the child's modules (which import torch, and transformers, which imports peft:
    ~6 s) run in one test process (`xdist_group("torch")`), and the other never imports
    them."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr == "_mock_name":  # what pytest's collection looks for
            raise AttributeError(attr)
        return getattr(self.module, attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        if attr != "_name":  # it would land on this stand-in, not the module
            raise TypeError(f"patch {self._name}.{attr} by its dotted path")
        object.__setattr__(self, attr, value)

    @property
    def module(self) -> ModuleType:
        return importlib.import_module(self._name)


def transformers() -> ModuleType:
    import transformers

    return transformers


@functools.cache
def training_arguments_fields() -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(transformers().TrainingArguments))


@functools.cache
def software_facts() -> SoftwareFacts:
    """The optimizers and compile backends the installed packages offer, as the probe reads
    them (`autotune.child.probe`)."""
    import torch._dynamo
    from transformers.training_args import OptimizerNames

    return SoftwareFacts(
        optimizer_names=tuple(o.value for o in OptimizerNames),
        compile_backends=tuple(torch._dynamo.list_backends(exclude_tags=())),
    )
