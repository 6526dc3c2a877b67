"""Does the search's figure hold in a long run? Train the recommended config for many steps.

Loads a finished study, takes its recommended trial's `TrainingArguments` and model kwargs,
and trains the same model on the same synthetic data in a plain HF `Trainer` in this process
(no sandbox, no fork server) for `--steps` optimizer steps; times the steps after
`--warmup-steps` the same way (device synchronised at each step end) and reads the peak memory
the same way. Prints and writes the comparison with what the search measured.

    python benchmarks/fidelity.py reports/<study> [--steps 200] [--warmup-steps 10]
        [--out fidelity.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import psutil
import torch
import transformers
import transformers.trainer  # imported before the memory baseline, as a trial's fork server has

from autotune.child import measure
from autotune.child.data import SyntheticDataset
from autotune.child.models import build_model
from autotune.common.models import ModelSpec
from autotune.common.units import GIB
from autotune.outputs.snapshot import read_snapshot
from autotune.store.storage import load_study_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study_dir", type=Path)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    snapshot = read_snapshot(load_study_dir(args.study_dir, None, None))
    info = snapshot.info
    picks = snapshot.picks
    picked = picks.recommended
    if picked is None:
        raise SystemExit("the study has no recommended trial")
    searched = picked.result

    on_cuda = info.device == "cuda"
    transformers.set_seed(0)
    baseline_rss = psutil.Process().memory_info().rss
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    model = build_model(ModelSpec(name=info.model, source="study", config=info.model_config),
                        info.task, **searched.model_kwargs)  # fmt: skip
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = transformers.TrainingArguments(
            output_dir=output_dir, max_steps=args.steps, save_strategy="no",
            logging_strategy="no", report_to="none", disable_tqdm=True,
            **searched.training_args,
        )  # fmt: skip
        per_step = (
            training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
        )
        dataset = SyntheticDataset(
            task=info.task,
            vocab_size=model.config.vocab_size,
            seq_len=info.seq_len,
            n_samples=per_step * args.steps,
            seed=0,
        )
        sync = torch.cuda.synchronize if on_cuda else (lambda: None)
        trainer = transformers.Trainer(model=model, args=training_args, train_dataset=dataset)
        timer = measure.StepTimer(args.warmup_steps, sync, measure.count_batches(trainer))
        trainer.add_callback(timer)
        trainer.train()
    times = timer.measured_step_times_s()
    long_run = measure.throughput(times, timer.measured_counts())
    peak_gib = (torch.cuda.max_memory_reserved() if on_cuda
                else measure.peak_rss_bytes() - baseline_rss) / GIB  # fmt: skip
    report = {
        "study": info.study,
        "trial": picked.number,
        "training_args": searched.training_args,
        "steps": args.steps,
        "timed_steps": len(times),
        "search": {"samples_per_s": searched.samples_per_s,
                   "peak_memory_gib": searched.peak_memory_gib,
                   "step_time_cv": searched.step_time_cv},
        "long_run": {"samples_per_s": long_run.samples_per_s, "peak_memory_gib": peak_gib,
                     "step_time_cv": long_run.step_time_cv,
                     "step_time_p90_ms": statistics.quantiles(times, n=10)[-1] * 1e3},
        # The figure the search printed: confirmed (median of the rounds) when it was.
        "confirmed": None if not picks.is_confirmed(picked) else {
            "samples_per_s": picks.samples_per_s(picked),
            "interval": picks.confirmed.interval(picked.number),
            "rounds": picks.confirmed.rounds,
        },
        "samples_per_s_ratio": long_run.samples_per_s / searched.samples_per_s,
        "confirmed_ratio": (long_run.samples_per_s / picks.samples_per_s(picked)
                            if picks.is_confirmed(picked) else None),
        "peak_memory_ratio": peak_gib / searched.peak_memory_gib,
    }  # fmt: skip
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
