"""A trial's settings as the files a user takes away: json, yaml, a runnable script, CLI flags.

The worker trains with `knobs.training_args(...)` and records the kwargs it used in its result;
these renderers write those recorded kwargs. So what is recommended is exactly what was measured.
"""

from __future__ import annotations

import ast
import json
import pprint
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from autotune.errors import StudyError
from autotune.models import TASK_CLASSES
from autotune.trial import write_json_atomic

if TYPE_CHECKING:  # the worker imports this module and must not import optuna via records
    from autotune.records import RunInfo, TrialRecord


def write_recommendation(
    study_dir: Path, recommendation: dict[str, Any], script: str
) -> list[Path]:
    """recommended.json and recommended.py; returns the paths written."""
    json_path = study_dir / "recommended.json"
    py_path = study_dir / "recommended.py"
    write_json_atomic(json_path, recommendation)
    py_path.write_text(script, encoding="utf-8")  # the encoding Python reads source in
    return [json_path, py_path]


def render(fmt: str, *, info: RunInfo, record: TrialRecord, report_to: str | None = None) -> str:
    """One trial's settings as json, yaml, a runnable script (py) or example-script flags."""
    payload = {
        "training_args": record.result.training_args,
        "model_kwargs": record.result.model_kwargs,
    }
    if fmt == "json":
        return json.dumps(payload, indent=2) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(payload, sort_keys=False)
    if fmt == "cli":
        return render_cli(record.result.training_args) + "\n"
    return render_script(info, record, report_to=report_to)


def render_cli(training_args: dict[str, Any]) -> str:
    """Flags for the HF example scripts (HfArgumentParser): `--bf16`, `--optim adamw_torch`.

    Shell-quoted, so a pasted command line passes each value as one argument and runs nothing.
    """
    flags = []
    for key, value in training_args.items():
        if value is True:
            flags.append(shlex.quote(f"--{key}"))
        else:  # False is spelled out: it is not every field's default
            flags.append(f"{shlex.quote(f'--{key}')} {shlex.quote(str(value))}")
    return " ".join(flags)


def render_script(info: RunInfo, record: TrialRecord, *, report_to: str | None = None) -> str:
    """A runnable script: the model from its config, random tokens, a Trainer with the args.

    The script's code is fixed text. Everything that comes from the study (model name or path,
    study and device names, the config, the kwargs) goes into constants written as Python
    literals, never into code or the docstring: a model folder may be named like code that
    closes a docstring and calls `os.system`. `report_to` (default: the study's) names the
    experiment trackers the script's run logs to.
    """
    metrics = record.result
    if info.task not in TASK_CLASSES:  # a study.db from elsewhere may hold anything
        raise StudyError(f"task {info.task!r}: not a task autotune trains; cannot write a script")
    facts = {
        "MODEL": info.model,
        "STUDY": info.study,
        "TRIAL": record.number,
        "DEVICE_NAME": info.device_name,
        "SAMPLES_PER_S": metrics.samples_per_s,
        "PEAK_MEMORY_GIB": metrics.peak_memory_gib,
        "TASK": info.task,
        "AUTO_CLASS_NAME": TASK_CLASSES[info.task][0],
        "SEQ_LEN": info.seq_len,
        "MODEL_CONFIG": info.model_config,
        "TRAINING_ARGS": metrics.training_args,
        "MODEL_KWARGS": metrics.model_kwargs,
        "REPORT_TO": (report_to or info.report_to).split(","),
    }
    constants = "".join(f"{name} = {_literal(name, value)}\n" for name, value in facts.items())
    return _SCRIPT_HEAD + constants + _SCRIPT_BODY


def _literal(name: str, value: Any) -> str:
    """`value` as a Python literal, checked to evaluate back to `value` itself."""
    source = pprint.pformat(value, indent=4, sort_dicts=False)
    try:
        same = ast.literal_eval(source) == value
    except (ValueError, SyntaxError):  # e.g. `nan`, `inf`: names, not literals
        same = False
    if not same:
        raise StudyError(
            f"{name} = {value!r}: the script cannot hold this as a Python literal (NaN and "
            "Infinity have none); fix the value at its source (for MODEL_CONFIG the model's "
            "config.json), or export format=json instead"
        )
    return source


_SCRIPT_HEAD = '''"""Train a model with the TrainingArguments autotune measured for it.

    python recommended.py [--max-steps N] [--output-dir DIR] [--report-to NAME ...]

The constants below say which model, trial and device; --help says it in words. The script
builds the model from its config with random weights and trains on random tokens, as the search
did. For your own run, load pretrained weights with AUTO_CLASS.from_pretrained(MODEL,
**MODEL_KWARGS) and pass your dataset as train_dataset.
"""

import argparse

import torch
import transformers

'''

_SCRIPT_BODY = """AUTO_CLASS = getattr(transformers, AUTO_CLASS_NAME)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, vocab_size, n_samples):
        self.input_ids = torch.randint(vocab_size, (n_samples, SEQ_LEN))
        if TASK == "sequence-classification":
            self.labels = torch.randint(2, (n_samples,))
        elif TASK == "seq2seq":
            self.labels = torch.randint(vocab_size, (n_samples, SEQ_LEN))
        else:
            self.labels = self.input_ids

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "labels": self.labels[i]}


def description():
    # argparse %-formats the description, so a % in a name is doubled. The lines are ours
    # (raw formatter): wrapping would break a model path at its hyphens.
    model, study, device, task = (s.replace("%", "%%") for s in (MODEL, STUDY, DEVICE_NAME, TASK))
    return (
        f"%(prog)s trains {model}\\n"
        f"({task}, seq_len {SEQ_LEN}) with the TrainingArguments of trial {TRIAL} of study "
        f"{study}\\non {device}: {SAMPLES_PER_S:.2f} samples/s, {PEAK_MEMORY_GIB:.2f} GiB peak."
    )


def main():
    parser = argparse.ArgumentParser(
        description=description(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--output-dir", default="output")
    parser.add_argument(
        "--report-to", nargs="+", default=REPORT_TO, metavar="NAME",
        help="experiment trackers to log to (TrainingArguments.report_to) [%(default)s]",
    )
    cli = parser.parse_args()
    config = transformers.AutoConfig.for_model(**MODEL_CONFIG)
    if TASK == "sequence-classification" and config.pad_token_id is None:
        config.pad_token_id = config.eos_token_id
    model = AUTO_CLASS.from_config(config, **MODEL_KWARGS)
    args = transformers.TrainingArguments(
        output_dir=cli.output_dir, max_steps=cli.max_steps, report_to=cli.report_to,
        **TRAINING_ARGS,
    )
    samples = args.per_device_train_batch_size * args.gradient_accumulation_steps * cli.max_steps
    dataset = RandomTokens(config.vocab_size, samples)
    transformers.Trainer(model=model, args=args, train_dataset=dataset).train()


if __name__ == "__main__":
    main()
"""
