"""A trial's settings as the files a user takes away: json, yaml, CLI flags, and in the study
folder recommended.json with recommended.py (`script.py`) and the configs that launch it on the
devices its trial used (`launch.py`).

The worker trains with `knobs.training_args(...)` and records the kwargs it used in its result;
these renderers write those kwargs, which the study's read checks against the same mapping (a
simulated trial, which trains nothing, gets them from it: `snapshot.read_snapshot`). So what is
recommended is exactly what was measured.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from autotune.common.errors import StudyError
from autotune.common.knobs import value_of
from autotune.common.layout import (
    ACCELERATE_YAML,
    DEEPSPEED_JSON,
    RECOMMENDED_JSON,
    RECOMMENDED_PY,
)
from autotune.common.output_files import write_atomic
from autotune.common.trial import write_json_atomic
from autotune.outputs.launch import ONE_PROCESS, accelerate_config
from autotune.outputs.script import render_script

if TYPE_CHECKING:  # types only: rendering an export reads no storage (records imports optuna)
    from autotune.common.trial import TrialResult
    from autotune.plan.run_info import RunInfo
    from autotune.store.records import TrialRecord


def write_recommendation(
    study_dir: Path, recommendation: dict[str, Any], script: str
) -> list[Path]:
    """recommended.json and recommended.py; deepspeed.json where the trial trained under
    DeepSpeed (its `deepspeed=` config, for `TrainingArguments(deepspeed="deepspeed.json")`
    or DeepSpeed's own launcher) and accelerate_config.yaml where it trained on ranks (for
    `accelerate launch`); returns the paths written. An earlier pick's files that this one
    has none of are removed."""
    json_path = study_dir / RECOMMENDED_JSON
    py_path = study_dir / RECOMMENDED_PY
    write_json_atomic(json_path, recommendation)
    write_atomic(py_path, script)  # UTF-8: the encoding Python reads source in
    written = [json_path, py_path]
    deepspeed = recommendation["training_args"].get("deepspeed")
    devices = recommendation["devices_per_trial"] or 1
    on_ranks = value_of(recommendation["params"], "strategy", devices=devices) not in ONE_PROCESS
    processes = recommendation["devices_per_trial"] if on_ranks else None
    accelerate = accelerate_config(
        recommendation["training_args"], processes, recommendation["environment"]
    )
    for name, content, write in (
        (DEEPSPEED_JSON, deepspeed, write_json_atomic),
        (ACCELERATE_YAML, accelerate, write_atomic),
    ):
        path = study_dir / name
        if content is None:
            path.unlink(missing_ok=True)
        else:
            write(path, content)
            written.append(path)
    return written


def render(fmt: str, *, info: RunInfo, record: TrialRecord, report_to: str | None = None) -> str:
    """One trial's settings as json, yaml, a runnable script (py) or example-script flags."""
    simulated = {} if info.simulated is None else {"simulated": info.simulated_note}
    payload = simulated | {
        "training_args": record.result.training_args,
        "model_kwargs": record.result.model_kwargs,
        "peft_config": record.result.peft_config,
        "quantization_config": record.result.quantization_config,
        "environment": record.result.environment,
    }
    if fmt == "json":
        return json.dumps(payload, indent=2) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(payload, sort_keys=False)
    if fmt == "cli":
        result = record.result
        flags = render_cli(result.training_args, result.model_kwargs, result.environment, result)
        # repr(): a newline in a name from the study is `\n`, and the comment stays one line.
        said = "".join(f"# {repr(v)[1:-1]}\n" for v in simulated.values())
        return said + flags + "\n"
    return render_script(info, record, report_to=report_to)


def render_cli(
    training_args: dict[str, Any],
    model_kwargs: dict[str, Any] | None = None,
    environment: dict[str, str] | None = None,
    model: TrialResult | None = None,
) -> str:
    """Flags for the HF example scripts (HfArgumentParser): `--bf16 True`, `--optim adamw_torch`.

    Shell-quoted, so a pasted command line passes each value as one argument and runs nothing.
    The model kwargs the trial measured with (the attention kernel) are no TrainingArguments
    field, and the examples (run_clm.py, run_glue.py, ...) have no flag for them: a comment
    line above the flags says so, rather than leave them out unsaid; so does one for the
    environment variables the trial set (torch.compile's modes, which accelerate reads).
    """
    comment = ""
    made = {
        name: config
        for name in ("peft_config", "quantization_config")
        if model is not None and (config := getattr(model, name)) is not None
    }
    if made:
        shown = ", ".join(f"{k}={v!r}" for k, v in made.items())
        comment = (
            f"# not flags of the HF example scripts: the trial's model had {shown}; build it "
            "with peft.LoraConfig and transformers.BitsAndBytesConfig (recommended.py does)\n"
        )
    if model_kwargs:
        # repr() writes a newline as `\n`: nothing in a value can end the comment line.
        kwargs = ", ".join(
            f"{k}={v!r}" if k.isidentifier() else f"{k!r}: {v!r}" for k, v in model_kwargs.items()
        )
        comment += (
            f"# not a flag of the HF example scripts: the trials built the model with {kwargs}; "
            "pass it to from_pretrained/from_config (recommended.py does)\n"
        )
    if environment:
        odd = [
            f"{k!r}={v!r}"
            for k, v in environment.items()
            if not (k.isidentifier() and re.fullmatch(r"[\w.-]+", v, re.ASCII))
        ]
        if odd:  # a study.db from elsewhere may hold anything: none of it reaches a shell line
            raise StudyError(f"environment {', '.join(odd)}: not a setting autotune makes")
        assignments = " ".join(f"{k}={v}" for k, v in environment.items())
        comment += f"# run the script with these set in its environment: {assignments}\n"
    # Every value spelled out, True too: HfArgumentParser reads a bare `--bf16` for a `bool`
    # field, but an optional one (`tf32: bool | None`) needs its value.
    flags = [
        f"{shlex.quote(f'--{key}')} {shlex.quote(str(value))}"
        for key, value in training_args.items()
    ]
    return comment + " ".join(flags)
