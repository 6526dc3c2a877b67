"""`RunInfo`: what a study is run for, settled by the plan and stored with the study, so that
every output can be rebuilt from the storage alone (`autotune.store.records.run_info` reads it
back)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

from autotune.common.errors import StudyError
from autotune.common.units import GIB
from autotune.common.version import __version__


@dataclass(frozen=True, kw_only=True, slots=True)
class RunInfo:
    """What a study was run for, stored with it so outputs can be rebuilt from storage alone.

    The one record of the study's settings: `make_plan` resolves them here from the
    `RunConfig` (which it leaves as given: `devices_per_trial=auto` stays), and every stage past
    the plan reads them here (`plan.info`), the config only for what the run itself does."""

    study: str
    model: str
    model_config: dict[str, Any]
    task: str
    seq_len: int
    device: str
    device_name: str
    space: str
    space_notes: list[str]
    effective_batch_size: int | None
    """batch_size x grad_accum when fixed by `effective_batch_size=`; None when it varies."""
    memory_budget_bytes: int
    """Resolved once when the study was made; every trial is judged against it."""
    headroom: float
    noise_cv: float
    math_change_min_gain: float = 1.10
    """A pick that changes the training must beat the same-training pick by this much."""
    report_to: str = "none"
    """Trackers the exported script logs to (`TrainingArguments.report_to`); trials never log."""
    adapter: dict[str, Any] | None = None
    """The adapter every trial trains (`peft=lora`: peft's LoraConfig kwargs, or the one a
    factory's model carries); None: a full fine-tune, or a factory's model without one."""
    data: dict[str, Any] | None = None
    """The user's data (`user_data.DataSpec` fields and its `fingerprint`); None: synthetic."""
    trainer: dict[str, str | None] | None = None
    """The user's Trainer: `factory` (`module:function`, or a file made absolute), the
    `search_dir` a module was looked up in, and the `sha256` of the file it runs (None in
    studies made before it was stored); None: autotune builds the Trainer."""
    # Measurement conditions (`autotune.plan.conditions`): None in studies made before they were
    # stored, and then not compared on resume.
    measure_steps: int | None = None
    warmup_steps: int | None = None
    cores_per_trial: int | None = None
    """The CPU cores each trial has (`capabilities.trial_cores`: `workers=` and affinity)."""
    devices_per_trial: int | None = None
    """The ranks each trial trains on (`devices_per_trial=`)."""
    versions: dict[str, str] | None = None
    """torch, transformers and autotune as the study was made with; trials measured under
    others are kept out of its front (`conditions.other_versions`)."""
    gpu_link: str | None = None
    """The slowest link between a trial's GPUs, in words (`common.links.GpuLink.describe`);
    None on one GPU, on CPU, or where NVML could not tell."""
    simulated: str | None = None
    """What answered the trials where none was measured (`executor=twin`): `the GPU twin of
    1x NVIDIA H100 80GB HBM3`; None: every figure was measured."""
    training_fields: tuple[str, ...] | None = None
    """Of the `TrainingArguments` fields that decide how the knobs' arguments are named
    (`knobs.NAMING_FIELDS`), those the installed transformers has: the outputs derive each
    trial's arguments with them (`snapshot.read_snapshot`). None in studies made before they
    were stored, or where the probe did not read the fields."""

    def stored(self) -> dict[str, Any]:
        """As the study stores it: a field of `STORED_WHEN_SET` only when set, so that a study
        without it reads in an earlier autotune too."""
        stored = asdict(self)
        for name in STORED_WHEN_SET:
            if stored[name] is None:
                del stored[name]
        return stored

    @property
    def simulated_note(self) -> str | None:
        """What every figure of a simulated study is, in words; None for a measured one."""
        if self.simulated is None:
            return None
        return f"simulated by {self.simulated}: every figure is its answer, not a measurement"

    @property
    def data_fingerprint(self) -> str | None:
        """What decides the tokens trained on; another dataset is another study."""
        return self.data["fingerprint"] if self.data else None

    @property
    def trainer_factory(self) -> str | None:
        return self.trainer["factory"] if self.trainer else None

    @property
    def batch_mode(self) -> str:
        return batch_mode(self.effective_batch_size)

    @property
    def memory_budget_gib(self) -> float:
        return self.memory_budget_bytes / GIB

    @property
    def memory_limit_gib(self) -> float:
        """Peak memory a recommended config may reach: the budget less the headroom."""
        return self.memory_budget_gib * (1 - self.headroom)

    @classmethod
    def from_stored(cls, stored: dict[str, Any], study: str = "") -> RunInfo:
        """From the study's stored dict, as any earlier autotune stored it. Raises a StudyError
        for one a later autotune wrote (keys this one does not know)."""
        stored = dict(stored)
        if "batch_mode" in stored:  # studies made before the setting itself was stored
            fixed = re.match(r"effective batch (\d+)", stored.pop("batch_mode"))
            stored["effective_batch_size"] = int(fixed.group(1)) if fixed else None
        unknown = sorted(set(stored) - {f.name for f in fields(cls)})
        if unknown:
            made_by = (stored.get("versions") or {}).get("autotune", "an unknown version")
            raise StudyError(
                f"study={study} was made by autotune {made_by}, and stores settings this "
                f"autotune ({__version__}) does not know: {', '.join(unknown)}. Open it with "
                "the autotune that made it (or a later one), or start another study"
            )
        if stored.get("training_fields") is not None:
            stored["training_fields"] = tuple(stored["training_fields"])  # a JSON list
        return cls(**stored)


STORED_WHEN_SET = ("gpu_link", "simulated", "training_fields")


def batch_mode(effective_batch_size: int | None) -> str:
    """How a study treats the effective batch, in words."""
    if effective_batch_size:
        return f"effective batch {effective_batch_size} (grad_accum derived)"
    return "grad_accum as the space says (effective batch varies)"
