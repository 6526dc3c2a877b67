"""What a search returns (`autotune.search`, `autotune.load`): the study as read from its
storage, with its picks, front and trials as `MeasuredConfig`s that build their
`TrainingArguments`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.common.trial import TrialResult
from autotune.common.trial_settings import MathChange, describe_params
from autotune.outputs.snapshot import StudySnapshot
from autotune.outputs.study_folder import table
from autotune.plan.run_info import RunInfo
from autotune.store.records import (
    TrialRecord,
)

if TYPE_CHECKING:
    import pandas
    import transformers


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredConfig:
    """One measured trial: its settings, what it measured, and how it compares with the
    baseline (HF defaults) of its study."""

    number: int
    params: dict[str, Any]
    """Every knob's value (`batch_size`, `precision`, `optim`, ...)."""
    result: TrialResult
    """Everything the trial measured: samples_per_s, peak_memory_gib, step_time_cv, ..."""
    speedup: float | None
    """samples/s over the baseline's (confirmed: the median of the round-by-round ratios);
    None when the baseline has no figure."""
    speedup_interval: tuple[float, float] | None
    """The lowest and highest confirmation round's ratio; None when not confirmed."""
    confirmed: bool
    """Measured again after the search, interleaved with the baseline and the other picks."""
    noisy: bool
    """Its step times varied more than the study's noise_cv."""
    changes_training: list[MathChange]
    """Differences from the baseline that change the training itself, not only its speed."""
    report_to: str
    description: str
    """`trial 7: 512.30 samples/s (1.42x the baseline) at 3.210 GiB`, with caveats."""

    @property
    def samples_per_s(self) -> float | None:
        return self.result.samples_per_s

    @property
    def peak_memory_gib(self) -> float | None:
        return self.result.peak_memory_gib

    @property
    def training_args_kwargs(self) -> dict[str, Any]:
        """The `TrainingArguments` kwargs the trial trained with (no run-only fields)."""
        return dict(self.result.training_args)

    @property
    def model_kwargs(self) -> dict[str, Any]:
        """`from_pretrained`/`from_config` kwargs it trained with (the attention kernel)."""
        return dict(self.result.model_kwargs)

    def training_args(
        self, output_dir: str = "output", **overrides: Any
    ) -> transformers.TrainingArguments:
        """A real `transformers.TrainingArguments` with the measured settings, logging to the
        study's `report_to`; `overrides` (learning_rate, num_train_epochs, ...) win."""
        import transformers  # only here: importing autotune stays light

        kwargs = {"report_to": self.report_to.split(","), **self.result.training_args}
        return transformers.TrainingArguments(output_dir=output_dir, **kwargs | overrides)

    def __str__(self) -> str:
        return f"{self.description}: {describe_params(self.params)}"


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchResult:
    """A study as read from its storage: what `autotune search` prints and writes."""

    snapshot: StudySnapshot
    study_dir: Path
    paths: list[Path]
    """The files written: trials.csv, pareto.csv, recommended.json/.py, report.html."""
    stopped: str | None = None
    """Why the search ended; None for a study read with `load`."""

    @property
    def info(self) -> RunInfo:
        return self.snapshot.info

    @property
    def front(self) -> list[MeasuredConfig]:
        """Feasible trials no other beats on both samples/s and memory, fastest first."""
        return [self._measured(r) for r in self.snapshot.front]

    @property
    def recommended(self) -> MeasuredConfig | None:
        """What to train with, below the memory budget less its headroom: the same-training
        pick unless a trial that changes the training is `math_change_min_gain` faster, clear
        of the noise (`why` says which); None when no trial fits."""
        return self._measured(self.snapshot.picks.recommended)

    @property
    def why(self) -> str:
        """Why the recommendation is that trial."""
        return self.snapshot.picks.why

    @property
    def same_training(self) -> MeasuredConfig | None:
        """The fastest trial that keeps the baseline's training (batch, precision, optimizer)."""
        return self._measured(self.snapshot.picks.same_training)

    @property
    def fastest(self) -> MeasuredConfig | None:
        """The fastest trial, which may change the training."""
        return self._measured(self.snapshot.picks.fastest)

    @property
    def memory_saver(self) -> MeasuredConfig | None:
        return self._measured(self.snapshot.picks.saver)

    @property
    def baseline(self) -> MeasuredConfig | None:
        return self._measured(self.snapshot.picks.baseline)

    @property
    def trials(self) -> list[MeasuredConfig]:
        return [self._measured(r) for r in self.snapshot.records]

    def to_dataframe(self) -> pandas.DataFrame:
        """A row per trial with the columns of trials.csv (settings, status, figures, noisy,
        changes_training, reason)."""
        import pandas

        columns, rows = table(self.snapshot.records, self.snapshot)
        return pandas.DataFrame(rows, columns=columns)

    def _measured(self, record: TrialRecord | None) -> MeasuredConfig | None:
        if record is None:
            return None
        picks = self.snapshot.picks
        return MeasuredConfig(
            number=record.number,
            params=dict(record.params),
            result=record.result,
            speedup=picks.speedup(record),
            speedup_interval=picks.speedup_interval(record),
            confirmed=picks.is_confirmed(record),
            noisy=self.snapshot.is_noisy(record),
            changes_training=self.snapshot.math_changes(record),
            report_to=self.info.report_to,
            description=picks.describe(record)
            if record.result.samples_per_s
            else (f"trial {record.number}: {record.status.value}"),
        )
