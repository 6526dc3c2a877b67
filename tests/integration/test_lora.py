"""A LoRA job end to end on CPU: tiny Llama- and Qwen2-architecture configs, real peft, real
worker processes. The search (the quick start's shape: 6 trials, the confirmation, every
output), its resume and its refusal of another adapter, recommended.py building the very model
the trials trained; QLoRA's 4-bit and 8-bit bases trained by the installed bitsandbytes; the
estimate's adapter counted as peft counts it."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.common.adapter import lora_config
from autotune.common.models import resolve_model
from autotune.common.trial import Status, TrialSpec
from autotune.execute.launchers import ForkserverLauncher
from autotune.execute.local import launch_trial
from autotune.plan.estimate import shape_of
from tests.integration.test_search_cpu import autotune

pytestmark = pytest.mark.slow

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "max_position_embeddings": 256}  # fmt: skip
"""The bundled configs' architecture, shrunk to a few layers."""
ARCHITECTURES = {"llama": "meta-llama/Llama-3.2-1B", "qwen2": "Qwen/Qwen2.5-0.5B"}


def tiny_folder(root: Path, base: str, **changes) -> Path:
    """A model folder of a bundled LLM's config.json made tiny (no head_dim: it follows)."""
    config = resolve_model(base).config | TINY | changes
    config.pop("head_dim", None)
    folder = root / base.split("/")[-1].lower()
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def search(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    folder = tiny_folder(root, ARCHITECTURES[request.param])
    args = [
        f"model={folder}",
        "peft=lora",
        "lora_r=8",
        "lora_alpha=16",
        "n_trials=6",
        "seq_len=64",
        "warmup_steps=1",
        "measure_steps=3",
        f"out={root / 'reports'}",
    ]
    proc = autotune("search", *args)
    study_dir = root / "reports" / f"{folder.name}-cpu-s64"
    return args, proc, study_dir


def test_a_lora_search_writes_every_output_with_its_adapter(search):
    _, proc, study_dir = search
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(causal-lm)" in proc.stdout.splitlines()[0]
    assert "adapter: LoRA r=8 alpha=16 dropout 0.05 on all-linear" in proc.stdout
    for name in ("study.db", "trials.csv", "pareto.csv", "recommended.json", "recommended.py",
                 "report.html"):  # fmt: skip
        assert (study_dir / name).is_file(), name
    assert "confirming: the baseline and the picks" in proc.stdout
    recommended = json.loads((study_dir / "recommended.json").read_text())
    assert recommended["peft_config"] == {
        "r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.05,
        "target_modules": "all-linear",
        "task_type": "CAUSAL_LM",
    }
    metrics = recommended["metrics"]
    # The adapter's parameters alone train: 2 blocks x r 8 x (in + out) of the 7 layers.
    assert 0 < metrics["trainable_params"] < metrics["n_params"] / 5
    # Every trial, the baseline's too, trained the same adapter.
    results = sorted(study_dir.glob("trials/*/result.json"))
    assert results
    for path in results:
        result = json.loads(path.read_text())
        if result["status"] == "ok":
            assert result["peft_config"] == recommended["peft_config"], path
            assert result["trainable_params"] == metrics["trainable_params"], path


def test_the_recommended_script_builds_the_model_the_trials_trained(search, tmp_path):
    _, proc, study_dir = search
    assert proc.returncode == 0, proc.stderr
    script = study_dir / "recommended.py"
    run = subprocess.run(
        [sys.executable, str(script), "--max-steps", "2", "--output-dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # Its model, built by its own code: the adapter on the frozen base, as measured.
    spec = importlib.util.spec_from_file_location("recommended", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import peft
    import transformers

    model = module.build_model(transformers.AutoConfig.for_model(**module.MODEL_CONFIG))
    assert isinstance(model, peft.PeftModel)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    recommended = json.loads((study_dir / "recommended.json").read_text())
    assert trainable == recommended["metrics"]["trainable_params"]


def test_a_resume_with_another_adapter_is_refused_and_the_same_one_resumes(search):
    args, proc, _ = search
    assert proc.returncode == 0, proc.stderr
    other = autotune("search", *[a if a != "lora_r=8" else "lora_r=4" for a in args])
    assert other.returncode == 2
    err = " ".join(other.stderr.split())
    assert "was made for other settings" in err
    assert "adapter LoRA r=8 alpha=16 dropout 0.05 on all-linear -> LoRA r=4" in err, err
    full = autotune("search", *[a for a in args if not a.startswith(("peft=", "lora_"))])
    assert full.returncode == 2 and "-> full fine-tune" in " ".join(full.stderr.split())
    again = autotune("search", *[a if a != "n_trials=6" else "n_trials=7" for a in args])
    assert again.returncode == 0, again.stderr
    assert "resuming: 6 finished trial(s) kept" in again.stdout


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_a_quantized_base_trains_its_adapter_on_cpu(tmp_path, quantization):
    folder = tiny_folder(tmp_path, ARCHITECTURES["llama"])
    adapter = lora_config(r=8, alpha=16, dropout=0.0, targets="all-linear", task="causal-lm")
    spec = TrialSpec(
        trial_number=0,
        model_name=str(folder),
        model_config=resolve_model(str(folder)).config,
        task="causal-lm",
        seq_len=32,
        device="cpu",
        params={"batch_size": 4, "precision": "fp32", "quantization": quantization},
        warmup_steps=1,
        measure_steps=2,
        seed=0,
        adapter=adapter,
    )
    result = launch_trial(spec, tmp_path / "trial", timeout_s=600, launcher=ForkserverLauncher())
    assert result.status is Status.OK, result.reason + result.stderr_tail
    expected = {"nf4": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "int8": {}}
    assert result.quantization_config.items() >= expected[quantization].items()
    # The parameters as built, however bitsandbytes packs them (the norms beside the matrices:
    # two a block and the last, 64 wide); the adapter's alone train.
    trained = shape_of(spec.model_config, adapter=adapter).trained
    assert result.trainable_params == trained
    assert result.n_params == shape_of(spec.model_config).parameters + 5 * 64 + trained


FAMILIES = {
    "llama": "meta-llama/Llama-3.1-8B",
    "qwen2": "Qwen/Qwen2.5-1.5B",
    "qwen3": "Qwen/Qwen3-8B",
    "mistral": "mistralai/Mistral-7B-v0.3",
    "gemma2": "google/gemma-2-2b",
    "phi3": "microsoft/Phi-3-mini-4k-instruct",
}


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"], ["o_proj", "down_proj"]])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_estimates_adapter_has_the_parameters_peft_gives_it(family, targets):
    import peft
    import torch
    import transformers

    config = resolve_model(FAMILIES[family]).config
    if family == "phi3" and targets != "all-linear":
        targets = [
            t.replace("q_proj", "qkv_proj").replace("v_proj", "gate_up_proj") for t in targets
        ]
    adapter = lora_config(r=8, alpha=16, dropout=0.0, targets=targets, task="causal-lm")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**config)
        )
        model = peft.get_peft_model(model, peft.LoraConfig(**adapter))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert shape_of(config, adapter=adapter).adapter_parameters == trainable
