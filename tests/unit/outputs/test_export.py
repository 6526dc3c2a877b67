import ast
import dataclasses
import shlex

import pytest

from autotune.common.errors import StudyError
from autotune.common.knobs import environment as knobs_environment
from autotune.common.knobs import training_args
from autotune.outputs.export import render, render_cli
from autotune.outputs.script import render_script
from tests.unit import installed
from tests.unit.installed import training_arguments_fields as installed_fields
from tests.unit.outputs.test_script import run_info, trial_record

PARAMS = {
    "batch_size": 16,
    "grad_accum": 2,
    "gradient_checkpointing": True,
    "precision": "bf16",
    "optim": "adafactor",
    "dataloader_num_workers": 0,
}


def test_knobs_map_to_training_arguments():
    kwargs = training_args(PARAMS, device="cuda", fields=installed_fields())
    assert kwargs["per_device_train_batch_size"] == 16
    assert kwargs["gradient_accumulation_steps"] == 2
    assert kwargs["bf16"] is True and kwargs["fp16"] is False
    assert kwargs["optim"] == "adafactor"
    assert "use_cpu" not in kwargs


def test_checkpointing_field_follows_the_installed_transformers():
    new = training_args(PARAMS, device="cuda", fields={"activation_checkpointing"})
    old = training_args(PARAMS, device="cuda", fields={"gradient_checkpointing"})
    assert new["activation_checkpointing"] is True and "gradient_checkpointing" not in new
    assert old["gradient_checkpointing"] is True and "activation_checkpointing" not in old


def test_cpu_runs_say_so_and_build_without_deprecation_warnings(recwarn):
    kwargs = training_args(PARAMS, device="cpu", fields=installed_fields())
    assert kwargs["use_cpu"] is True
    args = installed.transformers().TrainingArguments(output_dir="unused", **kwargs)
    assert args.per_device_train_batch_size == 16
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]


def test_compile_pin_memory_and_attention_map_to_their_fields():
    from autotune.common.knobs import model_kwargs

    params = {
        "torch_compile": "inductor",
        "compile_mode": "max-autotune",
        "dataloader_pin_memory": True,
    }
    kwargs = training_args(params, device="cuda", fields=installed_fields())
    assert kwargs["torch_compile"] is True
    assert kwargs["torch_compile_backend"] == "inductor"
    assert kwargs["torch_compile_mode"] == "max-autotune"
    assert kwargs["dataloader_pin_memory"] is True
    assert "torch_compile" not in training_args(
        {"torch_compile": "off"}, device="cuda", fields=installed_fields()
    )
    assert model_kwargs({"attn_implementation": "eager"}) == {"attn_implementation": "eager"}
    assert model_kwargs({}) == {}


def test_tf32_combines_with_16_bit_precision():
    kwargs = training_args({"precision": "bf16+tf32"}, device="cuda", fields=installed_fields())
    assert kwargs["bf16"] is True and kwargs["tf32"] is True and kwargs["fp16"] is False


def test_tf32_is_on_only_when_chosen_and_said_off_on_cuda_otherwise():
    fields = installed_fields()
    assert training_args({"precision": "tf32"}, device="cuda", fields=fields)["tf32"] is True
    # Off said explicitly on CUDA (else torch_compile turns it on); CPU has no TF32 to set.
    assert training_args({"precision": "fp16"}, device="cuda", fields=fields)["tf32"] is False
    assert "tf32" not in training_args({"precision": "fp32"}, device="cpu", fields=fields)


def test_cli_flags_follow_hf_argument_parser_conventions():
    flags = render_cli(
        {
            "per_device_train_batch_size": 32,
            "bf16": True,
            "fp16": False,
            "tf32": True,
            "optim": "adamw_torch_fused",
        }
    )
    assert flags == (
        "--per_device_train_batch_size 32 --bf16 True --fp16 False --tf32 True "
        "--optim adamw_torch_fused"
    )
    parser = installed.transformers().HfArgumentParser(installed.transformers().TrainingArguments)
    # As the example scripts' parser reads them (tf32 is `bool | None`: a bare flag is refused
    # there); the arguments' own checks want a GPU for bf16 and tf32.
    args = parser.parse_args(["--output_dir", "x", *flags.split()])
    assert args.per_device_train_batch_size == 32 and args.bf16 is True and args.fp16 is False
    assert args.tf32 is True and args.optim == "adamw_torch_fused"


def test_cli_flags_are_shell_quoted():
    training_args = {
        "bf16": True,
        "run_name": "a b; touch PWNED",
        "optim": "$(touch PWNED)",
        "output_dir": "it's `here`",
    }
    flags = render_cli(training_args)
    assert shlex.split(flags) == [
        "--bf16",
        "True",
        "--run_name",
        "a b; touch PWNED",
        "--optim",
        "$(touch PWNED)",
        "--output_dir",
        "it's `here`",
    ]


def test_cli_export_says_which_model_kwargs_the_example_scripts_cannot_set():
    record = trial_record("x")
    measured = dataclasses.replace(run_info("x"), simulated=None)
    text = render("cli", info=measured, record=record)  # what `autotune export` prints
    comment, flags = text.splitlines()
    # The attention kernel is no TrainingArguments field: said above the flags, not dropped.
    assert comment.startswith("# not a flag of the HF example scripts")
    assert "attn_implementation='x'" in comment and "from_pretrained" in comment
    assert flags == render_cli(record.result.training_args)
    # Pasted into a shell, the comment line runs nothing, even with a newline in a value.
    hostile = render_cli({"bf16": True}, {"attn_implementation": "eager\ntouch PWNED"})
    assert shlex.split(hostile, comments=True) == ["--bf16", "True"]
    assert render_cli({"bf16": True}, {}) == "--bf16 True"  # nothing set on the model: no comment


def test_a_simulated_study_s_exports_say_so_in_a_line_that_runs_nothing():
    record = trial_record("x")
    hostile = dataclasses.replace(run_info("x"), simulated="a\ntouch PWNED")
    said, *_ = render("cli", info=hostile, record=record).splitlines()
    assert said == "# simulated by a\\ntouch PWNED: every figure is its answer, not a measurement"
    for fmt in ("json", "yaml"):
        assert "simulated by a" in render(fmt, info=hostile, record=record)
    measured = dataclasses.replace(hostile, simulated=None)
    assert "simulated" not in render("json", info=measured, record=record)


def test_compile_modes_set_in_the_environment_are_exported_as_they_ran():
    params = {"torch_compile": "inductor", "compile_regional": True, "compile_dynamic": False}
    environment = knobs_environment(params)
    assert environment == {
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "true",
        "ACCELERATE_DYNAMO_USE_DYNAMIC": "false",
    }
    assert knobs_environment({"torch_compile": "off", "compile_regional": True}) == {}
    comment, flags = render_cli({"torch_compile": True}, {}, environment).splitlines()
    assert comment == (
        "# run the script with these set in its environment: "
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=true "
        "ACCELERATE_DYNAMO_USE_DYNAMIC=false"
    )
    assert flags == "--torch_compile True"
    record = trial_record("x")
    record = dataclasses.replace(
        record, result=dataclasses.replace(record.result, environment=environment)
    )
    script = render_script(run_info("x"), record)
    assigned = [n for n in ast.parse(script).body if isinstance(n, ast.Assign)]
    constants = {n.targets[0].id: n.value for n in assigned if isinstance(n.targets[0], ast.Name)}
    assert ast.literal_eval(constants["ENVIRONMENT"]) == environment
    assert "os.environ.update(ENVIRONMENT)" in script
    # A study.db from elsewhere may hold anything: none of it reaches a shell line.
    with pytest.raises(StudyError, match="not a setting autotune makes"):
        render_cli({}, {}, {"X": "1\ntouch PWNED"})
