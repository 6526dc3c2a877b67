import dataclasses

import transformers

from autotune.export import render_cli, training_args

INSTALLED = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
PARAMS = {
    "batch_size": 16,
    "grad_accum": 2,
    "gradient_checkpointing": True,
    "precision": "bf16",
    "optim": "adafactor",
    "dataloader_num_workers": 0,
}


def test_knobs_map_to_training_arguments():
    kwargs = training_args(PARAMS, device="cuda", fields=INSTALLED)
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
    kwargs = training_args(PARAMS, device="cpu", fields=INSTALLED)
    assert kwargs["use_cpu"] is True
    args = transformers.TrainingArguments(output_dir="unused", **kwargs)
    assert args.per_device_train_batch_size == 16
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]


def test_compile_pin_memory_and_attention_map_to_their_fields():
    from autotune.export import model_kwargs

    params = {
        "torch_compile": "inductor",
        "compile_mode": "max-autotune",
        "dataloader_pin_memory": True,
    }
    kwargs = training_args(params, device="cuda", fields=INSTALLED)
    assert kwargs["torch_compile"] is True
    assert kwargs["torch_compile_backend"] == "inductor"
    assert kwargs["torch_compile_mode"] == "max-autotune"
    assert kwargs["dataloader_pin_memory"] is True
    assert "torch_compile" not in training_args(
        {"torch_compile": "off"}, device="cuda", fields=INSTALLED
    )
    assert model_kwargs({"attn_implementation": "eager"}) == {"attn_implementation": "eager"}
    assert model_kwargs({}) == {}


def test_tf32_combines_with_16_bit_precision():
    kwargs = training_args({"precision": "bf16+tf32"}, device="cuda", fields=INSTALLED)
    assert kwargs["bf16"] is True and kwargs["tf32"] is True and kwargs["fp16"] is False


def test_tf32_is_set_only_when_chosen():
    assert training_args({"precision": "tf32"}, device="cuda", fields=INSTALLED)["tf32"] is True
    assert "tf32" not in training_args({"precision": "fp16"}, device="cuda", fields=INSTALLED)


def test_cli_flags_follow_hf_argument_parser_conventions():
    flags = render_cli({"per_device_train_batch_size": 32, "bf16": True, "fp16": False,
                        "optim": "adamw_torch_fused"})  # fmt: skip
    assert flags == "--per_device_train_batch_size 32 --bf16 --fp16 False --optim adamw_torch_fused"
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(["--output_dir", "x", "--use_cpu", *flags.split()])
    assert args.per_device_train_batch_size == 32 and args.bf16 and not args.fp16
    assert args.optim == "adamw_torch_fused"
