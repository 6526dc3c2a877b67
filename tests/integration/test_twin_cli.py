"""`autotune search ... executor=twin gpu=NAME`: a search on a GPU not in hand, from the command
line, with the installed software's facts. Its study is simulated everywhere it shows a
figure, and its exports train exactly the recommended trial's settings."""

import ast
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.common.knobs import precision_parts, training_args, value_of
from tests.unit import installed

ARG_FIELDS = frozenset(installed.training_arguments_fields())


def autotune(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=check,
    )


@pytest.fixture(scope="module")
def twin_study(tmp_path_factory):
    folder = tmp_path_factory.mktemp("twin")
    search = autotune(
        "search",
        "model=bert-large-uncased",
        "seq_len=512",
        "n_trials=12",
        "executor=twin",
        "gpu=A100-80GB",
        "out=reports",
        "study=a100",
        cwd=folder,
    )
    return folder / "reports" / "a100", search.stdout


def cuda_arguments(monkeypatch, training_args_kwargs, output_dir):
    """TrainingArguments as a CUDA host builds them: transformers refuses bf16 and tf32 where
    it finds no GPU, and reads the device only when asked."""
    import transformers
    from transformers import training_args as module

    monkeypatch.setattr(module, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(module, "is_torch_tf32_available", lambda: True)
    return transformers.TrainingArguments(output_dir=str(output_dir), **training_args_kwargs)


def test_the_search_says_it_is_simulated_and_what_the_gpu_would_spend(twin_study):
    study_dir, stdout = twin_study
    assert "simulated: the GPU twin of 1x NVIDIA A100-SXM4-80GB answers every trial" in stdout
    said = "simulated by the GPU twin of 1x NVIDIA A100-SXM4-80GB: every figure is its answer"
    assert said in stdout
    recommended = json.loads((study_dir / "recommended.json").read_text())
    minutes = recommended["simulated"].split("would take ")[1]
    clock, gpu_minutes = float(minutes.split(" min")[0]), float(minutes.split("(")[1].split()[0])
    # One GPU, one worker: the clock is the GPU time; a trial on an A100 costs tens of seconds.
    assert clock == gpu_minutes and clock > 12 * 10 / 60
    assert f"simulated: the pick is trial {recommended['trial']} on the GPU twin" in stdout


def test_every_output_says_it_is_simulated(twin_study, tmp_path):
    study_dir, _ = twin_study
    note = "simulated by the GPU twin of 1x NVIDIA A100-SXM4-80GB"
    assert note in json.loads((study_dir / "recommended.json").read_text())["simulated"]
    html = (study_dir / "report.html").read_text()
    assert "(simulated by the GPU twin)</title>" in html and note in html
    exported = json.loads(autotune("export", str(study_dir), "format=json", cwd=tmp_path).stdout)
    assert exported["simulated"].startswith(note)
    assert autotune("export", str(study_dir), "format=cli", cwd=tmp_path).stdout.startswith(
        f"# {note}"
    )
    assert note in autotune("export", str(study_dir), "format=yaml", cwd=tmp_path).stdout
    shown = autotune("report", str(study_dir), cwd=tmp_path).stdout
    assert shown.startswith(f"{note}: every figure is its answer, not a measurement")
    script = study_dir / "recommended.py"
    assert "SIMULATED = 'the GPU twin of 1x NVIDIA A100-SXM4-80GB'" in script.read_text()
    helped = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, check=True
    )
    assert "simulated by the GPU twin of 1x NVIDIA A100-SXM4-80GB, not measured:" in helped.stdout


def test_the_exports_train_exactly_the_recommended_trial_s_settings(twin_study, monkeypatch):
    study_dir, _ = twin_study
    recommended = json.loads((study_dir / "recommended.json").read_text())
    params = recommended["params"]
    kwargs = recommended["training_args"]
    assert kwargs == training_args(params, device="cuda", fields=ARG_FIELDS)
    args = cuda_arguments(monkeypatch, kwargs, study_dir / "run")
    # Field by field, against the trial's settings as the knobs name them.
    parts = precision_parts(params["precision"])
    expected = {
        "per_device_train_batch_size": params["batch_size"],
        "gradient_accumulation_steps": params["grad_accum"],
        "bf16": "bf16" in parts,
        "fp16": "fp16" in parts,
        "tf32": "tf32" in parts,
        "optim": params["optim"],
        "dataloader_num_workers": value_of(params, "dataloader_num_workers"),
    }
    built = {k: getattr(args, k) for k in expected}
    built["optim"] = str(getattr(args.optim, "value", args.optim))
    assert built == expected
    for field, value in kwargs.items():
        got = getattr(args, field)
        assert getattr(got, "value", got) == value, field
    # The script's and the flags' arguments are the same ones.
    script = (study_dir / "recommended.py").read_text()
    literal = script.split("\nTRAINING_ARGS = ", 1)[1].split("\nMODEL_KWARGS = ", 1)[0]
    assert ast.literal_eval(literal) == kwargs
    # The flags, as an HF example script's parser reads them, make the same arguments.
    import transformers

    exported = autotune("export", str(study_dir), "format=cli", cwd=study_dir).stdout
    (flags,) = [line for line in exported.splitlines() if not line.startswith("#")]
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    (parsed,) = parser.parse_args_into_dataclasses(
        ["--output_dir", str(study_dir / "run"), *shlex.split(flags)]
    )
    for field in kwargs:
        assert getattr(parsed, field) == getattr(args, field), field


def test_confirm_and_verify_refuse_a_simulated_study_and_a_real_search_does_not_join_it(
    twin_study, tmp_path
):
    study_dir, _ = twin_study
    for command in ("confirm", "verify"):
        refused = autotune(command, str(study_dir), cwd=tmp_path, check=False)
        assert refused.returncode == 2
        assert "is simulated by the GPU twin of 1x NVIDIA A100-SXM4-80GB" in refused.stderr
    search = autotune(
        "search",
        "model=bert-large-uncased",
        "seq_len=512",
        f"out={study_dir.parent}",
        "study=a100",
        "force=true",  # past the refusal of a CPU too slow for bert-large: to the study
        cwd=tmp_path,
        check=False,
    )
    assert search.returncode == 2
    assert "Resume it with executor=twin and its gpu=" in search.stderr


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (["executor=twin", "gpu=xH100y"], "gpu=xH100y: not a GPU the twin models (H100, H200"),
        (["gpu=H100"], "gpu=H100: for executor=twin"),
        (["executor=twin"], "executor=twin needs gpu=NAME"),
        (["executor=twin", "gpu=H100", "device=cpu"], "executor=twin with device=cpu"),
    ],
)
def test_a_twin_search_named_wrong_is_refused_before_anything_is_written(
    tmp_path, settings, problem
):
    refused = autotune("search", "model=bert-large-uncased", *settings, cwd=tmp_path, check=False)
    assert refused.returncode == 2
    assert problem in refused.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_search_naming_another_study_s_file_says_it_makes_a_second_study_there(tmp_path):
    """Run on the twin for its speed: what is said is the storage's, whatever runs trials."""
    settings = ["model=gpt2", "seq_len=128", "n_trials=3", "executor=twin", "gpu=L4"]
    autotune("search", *settings, "study=a", cwd=tmp_path)
    storage = f"storage=sqlite:///{tmp_path / 'reports' / 'a' / 'study.db'}"
    second = autotune("search", *settings, "study=b", storage, cwd=tmp_path)
    assert "holds study a too: this search makes study=b beside it in the same file" in (
        second.stdout
    )
