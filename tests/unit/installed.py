"""What the installed torch and transformers offer, imported on first use: unit tests of modules
that never import them (the knob catalogue, the space, the exports) check their mapping
against the real packages without every unit test paying for the import at collection."""

import dataclasses
import functools
from types import ModuleType

from autotune.plan.space_file import SoftwareFacts


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
