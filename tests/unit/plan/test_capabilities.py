import dataclasses
import functools
import itertools
import os
import warnings

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.common.device import DeviceInfo
from autotune.common.errors import SpaceError
from autotune.common.knobs import training_args
from autotune.common.placement import Placement
from autotune.plan.batch_rule import apply_sampling_rules
from autotune.plan.capabilities import fit_space, trial_cores
from autotune.plan.space import SMALL_BATCHES, SamplingRules, multiple_for
from autotune.plan.space_file import load_space, shipped_names
from tests.unit import installed
from tests.unit.installed import training_arguments_fields as installed_fields

DEVICE_OF = {"cpu": "cpu", "v100": "cuda", "h100": "cuda"}
FACTS = installed.software_facts


@functools.cache
def profiles() -> dict[str, tuple[str, DeviceInfo]]:
    """Machines as the probe would describe them, with the installed packages' facts."""
    facts = installed.software_facts()
    common = dict(
        total_memory_bytes=80 * 2**30,
        free_memory_bytes=79 * 2**30,
        optimizer_names=facts.optimizer_names,
        compile_backends=facts.compile_backends,
    )
    return {
        "cpu": ("cpu", DeviceInfo(cuda_available=False, name="cpu", bf16_supported=True, **common)),
        "v100": (
            "cuda",
            DeviceInfo(
                cuda_available=True, name="Tesla V100-SXM2-32GB", compute_capability="7.0", **common
            ),
        ),
        "h100": (
            "cuda",
            DeviceInfo(
                cuda_available=True,
                name="NVIDIA H100 80GB HBM3",
                compute_capability="9.0",
                bf16_supported=True,
                tf32_supported=True,
                **common,
            ),
        ),
    }


COMBINATIONS = [
    (space, profile, effective)
    for space, profile, effective in itertools.product(shipped_names(), DEVICE_OF, (None, 32, 64))
    if load_space(space).device in ("any", DEVICE_OF[profile])
]


TOKENS_PER_SAMPLE = 100
"""Synthetic samples' length: on an H100, 16-bit batch sizes in multiples of 16 (100 x 16
tokens is a multiple of 64); fp32's stay multiples of 8."""


def fitted(space_name, profile, effective, tokens_per_sample=TOKENS_PER_SAMPLE):
    device, info = profiles()[profile]
    rules = SamplingRules(
        effective_batch_size=effective,
        tensor_core_64=info.tensor_core_64,
        tokens_per_sample=tokens_per_sample,
    )
    space = apply_sampling_rules(fit_space(load_space(space_name, FACTS()), device, info), rules)
    return space, rules, device


def test_cpu_removes_fp16_tf32_paged_and_says_why():
    space, _, _ = fitted("memory", "cpu", None)
    assert space.knobs["precision"].choices == ("bf16",)
    assert "paged_adamw_8bit" not in space.knobs["optim"].choices
    notes = "\n".join(space.notes)
    assert "precision=fp16: the Trainer ignores fp16 on CPU" in notes
    assert "optim=paged_adamw_8bit: paged optimizers" in notes


def test_pre_ampere_gpus_lose_bf16_and_tf32():
    space, _, _ = fitted("default", "v100", None)
    assert space.knobs["precision"].choices == ("fp32", "fp16")
    assert "bf16 needs an Ampere or newer GPU (this one is 7.0)" in "\n".join(space.notes)


def test_bitsandbytes_optimizers_go_when_it_does_not_import():
    device, info = profiles()["h100"]
    broken = dataclasses.replace(info, bitsandbytes_error="ImportError: no libcudart")
    space = fit_space(load_space("default", FACTS()), device, broken)
    assert not {"adamw_bnb_8bit", "paged_adamw_8bit"} & set(space.knobs["optim"].choices)
    assert "bitsandbytes does not import here (ImportError: no libcudart)" in "\n".join(space.notes)


def test_torchaos_optimizers_go_when_it_does_not_import(tmp_path):
    path = tmp_path / "lowbit.yaml"
    path.write_text(
        "knobs:\n  optim: {choices: [adamw_torch, adamw_torch_8bit, adamw_torch_4bit]}\n"
    )
    device, info = profiles()["cpu"]
    assert fit_space(load_space(str(path)), device, info).knobs["optim"].choices == (
        "adamw_torch",
        "adamw_torch_8bit",
        "adamw_torch_4bit",
    )
    missing = dataclasses.replace(
        info, torchao_error="not installed (pip install 'autotune[torchao]')"
    )
    space = fit_space(load_space(str(path)), device, missing)
    assert space.knobs["optim"].choices == ("adamw_torch",)
    assert (
        "removed optim=adamw_torch_4bit: torchao does not import here (not installed (pip "
        "install 'autotune[torchao]'))"
    ) in space.notes


def test_a_knob_left_without_values_is_an_error_naming_the_reasons(tmp_path):
    path = tmp_path / "fp16only.yaml"
    path.write_text("knobs:\n  precision: {choices: [fp16, tf32]}\n")
    device, info = profiles()["cpu"]
    with pytest.raises(SpaceError, match="precision: every value is removed on cpu"):
        fit_space(load_space(str(path)), device, info)


def test_synthetic_data_fixes_the_loader_and_padding_knobs():
    space = fit_space(load_space("data"), *profiles()["cpu"])
    for name, fixed in (
        ("dataloader_num_workers", 0),
        ("group_by_length", False),
        ("pad_to_multiple_of", 1),
        ("dataloader_prefetch_factor", 2),
    ):
        assert space.knobs[name].choices == (fixed,)
        assert any(n.startswith(f"{name} fixed at") and "synthetic" in n for n in space.notes)
    assert space.knobs["batch_size"].choices == (8, 16, 32), "the rest is searched"
    data = fit_space(load_space("data"), *profiles()["cpu"], "data")
    assert data.knobs["dataloader_num_workers"].choices == (0, 1, 2, 4)
    assert data.knobs["pad_to_multiple_of"].choices == (1, 8, 64)


def test_the_data_space_proposes_no_more_loader_workers_than_a_trial_has_cores():
    space = fit_space(load_space("data"), *profiles()["cpu"], "data", cores=2)
    assert space.knobs["dataloader_num_workers"].choices == (0, 1, 2)
    assert "removed dataloader_num_workers above 2 (4): a trial has 2 CPU cores" in "\n".join(
        space.notes
    )
    one = fit_space(load_space("data"), *profiles()["cpu"], "trainer", cores=1)
    assert one.knobs["dataloader_num_workers"].choices == (0, 1)
    # Synthetic data fixes the loader at 0 workers anyway: nothing more to say.
    synthetic = fit_space(load_space("data"), *profiles()["cpu"], cores=1)
    assert not [n for n in synthetic.notes if "core" in n]


def test_a_space_whose_every_loader_worker_count_exceeds_the_cores_is_refused(tmp_path):
    path = tmp_path / "loaders.yaml"
    path.write_text("knobs:\n  dataloader_num_workers: {choices: [4, 8]}\n")
    with pytest.raises(SpaceError, match=r"every value \(4, 8\) is above the cores a trial"):
        fit_space(load_space(str(path)), *profiles()["cpu"], "data", cores=2)


def test_a_trial_has_its_workers_cores_or_a_share_of_the_hosts():
    host = len(os.sched_getaffinity(0))
    assert trial_cores([Placement(cpus=(0, 1, 2)), Placement(cpus=(3, 4))]) == 2  # the smaller set
    assert trial_cores([Placement()]) == host  # one worker: every core
    gpus = [Placement(cuda_devices=(str(i),), cuda_indices=(i,)) for i in range(host + 1)]
    assert trial_cores(gpus) == 1  # GPU workers share the host's cores, one at least
    assert trial_cores([]) is None


def test_a_users_trainer_pads_with_its_own_collator():
    space = fit_space(load_space("data"), *profiles()["cpu"], "trainer")
    assert "pad_to_multiple_of" not in space.knobs
    assert any("removed pad_to_multiple_of" in n for n in space.notes)
    assert space.knobs["group_by_length"].choices == (False, True), "a TrainingArguments field"


@pytest.mark.parametrize(("space_name", "profile", "effective"), COMBINATIONS)
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_sampled_configs_obey_every_rule(space_name, profile, effective, seed):
    try:
        space, rules, device = fitted(space_name, profile, effective)
    except SpaceError as exc:
        assert "effective_batch_size" in str(exc)
        return
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=3)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    for _ in range(6):  # several trials: Optuna must accept the distributions from trial to trial
        trial = study.ask()
        params = space.sample(trial, rules)
        study.tell(trial, [float(params["batch_size"]), float(params.get("grad_accum", 1))])
        check_rules(space, rules, device, profiles()[profile][1], params)


def check_rules(space, rules, device, info, params):
    for name, value in params.items():
        if name != "grad_accum" or not rules.effective_batch_size:
            assert value in space.knobs[name].choices, (name, value)
    batch = params["batch_size"]
    knob = space.knobs["batch_size"]
    multiple = multiple_for(knob, params.get("precision"), rules)
    assert batch % multiple == 0 or (batch in SMALL_BATCHES and not knob.is_range)
    if (
        info.tensor_core_64
        and knob.multiple_of == "auto"
        and params["precision"][:4] in ("bf16", "fp16")
    ):
        assert batch * rules.tokens_per_sample % 64 == 0  # the matmuls' rows tile by 64
    if rules.effective_batch_size:
        assert batch * params["grad_accum"] == rules.effective_batch_size
    assert ("compile_mode" in params) == (params.get("torch_compile", "off") != "off")
    precision = params.get("precision", "fp32").split("+")
    if device == "cpu":
        assert "fp16" not in precision and "tf32" not in precision
        assert not params.get("optim", "").startswith("paged_")
        assert params.get("torch_compile") != "cudagraphs"
        assert params.get("dataloader_pin_memory") is not True
    if not info.bf16_supported:
        assert "bf16" not in precision
    if not info.tf32_supported and device == "cuda":
        assert "tf32" not in precision


def extreme_configs(space):
    """Every value of every knob at least once, paired with the smallest and largest batch."""
    batch = space.knobs["batch_size"].choices
    for name, knob in space.knobs.items():
        for value in knob.choices:
            for size in (batch[0], batch[-1]):
                params = {k: v.choices[0] for k, v in space.knobs.items()}
                params.update({"batch_size": size, name: value})
                if params.get("torch_compile", "off") == "off":
                    params.pop("compile_mode", None)
                yield params


@pytest.mark.parametrize("space_name", shipped_names())
def test_extreme_configs_build_training_arguments_without_warnings(
    space_name, monkeypatch, tmp_path
):
    profile = "cpu" if load_space(space_name).device in ("cpu", "any") else "h100"
    space, _, device = fitted(space_name, profile, None)
    hf_training_args = installed.transformers().training_args
    if device == "cuda":
        # TrainingArguments checks the GPU for tf32/bf16; this machine may have none, so the
        # checks answer as they would on the H100 this profile describes.
        monkeypatch.setattr(hf_training_args, "is_torch_tf32_available", lambda: True)
        monkeypatch.setattr(hf_training_args, "is_torch_bf16_gpu_available", lambda: True)
    fields = installed_fields()
    for params in extreme_configs(space):
        kwargs = training_args(params, device=device, fields=fields)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            warnings.simplefilter("error", DeprecationWarning)
            args = installed.transformers().TrainingArguments(output_dir=str(tmp_path), **kwargs)
        assert args.per_device_train_batch_size == params["batch_size"]


def test_bf16_leaves_a_cpu_space_where_the_cpu_has_no_bf16_instructions():
    device, info = profiles()["cpu"]
    emulating = dataclasses.replace(info, bf16_supported=False)
    space = fit_space(load_space("cpu", FACTS()), device, emulating)
    assert space.knobs["precision"].choices == ("fp32",)
    assert any(
        n.startswith("removed precision=bf16: this CPU has no bf16 instructions")
        for n in space.notes
    )
    assert "bf16" in fit_space(load_space("cpu", FACTS()), device, info).knobs["precision"].choices


GPU_KNOBS = """knobs:
  precision: {choices: [bf16, fp8]}
  attn_implementation: {choices: [sdpa, flash_attention_2, flash_attention_3]}
  use_liger_kernel: {choices: [false, true]}
  gradient_checkpointing: true
  activation_offload: {choices: [false, true]}
  packing: {choices: [false, true]}
"""
KERNELS = {"flash_attn_error": None, "flash_attn_3_error": None, "liger_error": None,
           "liger_model_types": ("llama", "qwen2")}  # fmt: skip


def gpu_knobs(tmp_path, profile, model=("llama", "causal-lm"), **facts):
    path = tmp_path / "gpu.yaml"
    path.write_text(GPU_KNOBS)
    device, info = profiles()[profile]
    info = dataclasses.replace(info, **{**KERNELS, **facts})
    space = fit_space(load_space(str(path)), device, info, "data", model=model)
    return {name: knob.choices for name, knob in space.knobs.items()}, "\n".join(space.notes)


def test_gpu_kernels_stay_on_a_hopper_gpu_with_their_packages(tmp_path):
    choices, notes = gpu_knobs(tmp_path, "h100", compute_capability="9.0")
    assert choices["attn_implementation"] == ("sdpa", "flash_attention_2", "flash_attention_3")
    assert choices["precision"] == ("bf16", "fp8")
    assert choices["use_liger_kernel"] == choices["activation_offload"] == (False, True)
    assert choices["packing"] == (False, True) and notes == ""


def test_gpu_kernels_leave_by_device_capability_and_package_each_with_its_reason(tmp_path):
    choices, notes = gpu_knobs(
        tmp_path, "h100", compute_capability="8.0", flash_attn_3_error="not installed"
    )
    assert choices["attn_implementation"] == ("sdpa", "flash_attention_2")
    assert (
        "removed attn_implementation=flash_attention_3: FlashAttention 3 needs a Hopper or "
        "newer GPU (this one is 8.0)" in notes
    )
    assert (
        "removed precision=fp8: fp8 matmuls need a GPU of compute capability 8.9 or newer "
        "(Ada, Hopper) (this one is 8.0)" in notes
    )
    choices, notes = gpu_knobs(
        tmp_path,
        "h100",
        compute_capability="7.5",
        flash_attn_error="not installed (pip install flash-attn)",
        liger_error="ModuleNotFoundError: triton",
    )
    assert choices["attn_implementation"] == ("sdpa",) and "use_liger_kernel" in choices
    assert choices["use_liger_kernel"] == (False,)
    assert "FlashAttention 2 needs an Ampere or newer GPU (this one is 7.5)" in notes
    assert (
        "removed use_liger_kernel=true: liger-kernel does not import here "
        "(ModuleNotFoundError: triton)" in notes
    )
    choices, notes = gpu_knobs(tmp_path, "h100", torchao_error="not installed")
    assert choices["precision"] == ("bf16",)
    assert "fp8 trains through torchao's Float8Linear; torchao does not import here" in notes


def test_gpu_kernels_leave_a_cpu_search_each_with_its_reason(tmp_path):
    choices, notes = gpu_knobs(tmp_path, "cpu")
    assert choices["attn_implementation"] == ("sdpa",) and choices["precision"] == ("bf16",)
    assert choices["use_liger_kernel"] == choices["activation_offload"] == (False,)
    for reason in (
        "removed attn_implementation=flash_attention_2: FlashAttention's kernels run on CUDA "
        "GPUs only",
        "removed use_liger_kernel=true: Liger's kernels are Triton kernels for CUDA GPUs",
        "removed activation_offload=true: it moves saved activations from GPU memory to the "
        "host's: on CPU they are there",
        "removed packing=true: packed samples stay apart only under FlashAttention's "
        "variable-length kernel",
    ):
        assert reason in notes


def test_liger_and_packing_leave_the_models_they_cannot_train(tmp_path):
    choices, notes = gpu_knobs(tmp_path, "h100", model=("bert", "sequence-classification"))
    assert choices["use_liger_kernel"] == choices["packing"] == (False,)
    assert (
        "removed use_liger_kernel=true: Liger has no kernels for bert models (it patches: "
        "llama, qwen2)"
    ) in notes
    assert (
        "removed packing=true: packing flattens causal-lm samples into one row; a "
        "sequence-classification model keeps its samples apart"
    ) in notes
