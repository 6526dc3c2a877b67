"""Knobs of today's guide that run on CPU, each in real trials: partial checkpointing between
none and full, torchao's low-bit AdamW, torch.compile's regional mode set through the
environment accelerate reads."""

from pathlib import Path

import pytest

from autotune.common.models import resolve_model
from autotune.common.trial import Status, TrialResult, TrialSpec
from autotune.execute.launchers import ForkserverLauncher
from autotune.execute.local import launch_trial
from tests.conftest import TINY_MODEL

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def launcher():
    return ForkserverLauncher()


def run(folder: Path, launcher, model: str, seq_len: int, **params) -> TrialResult:
    spec = TrialSpec(
        trial_number=0,
        model_name=model,
        model_config=resolve_model(model).config,
        task="sequence-classification",
        seq_len=seq_len,
        device="cpu",
        params={"batch_size": 8, "precision": "fp32", "optim": "sgd", **params},
        warmup_steps=1,
        measure_steps=2,
        seed=0,
    )
    result = launch_trial(spec, folder, timeout_s=600, launcher=launcher)
    assert result.status is Status.OK, result.reason + result.stderr_tail
    return result


def test_checkpointing_every_second_block_keeps_memory_between_none_and_every_block(
    tmp_path, launcher
):
    # 4 blocks at seq 512, batch 8: a block's activations are ~0.1 GiB, its input 4 MB.
    model, seq_len = "google/bert_uncased_L-4_H-256_A-4", 512
    none = run(tmp_path / "none", launcher, model, seq_len, gradient_checkpointing=False)
    every = run(tmp_path / "every", launcher, model, seq_len, gradient_checkpointing=True)
    half = run(
        tmp_path / "half",
        launcher,
        model,
        seq_len,
        gradient_checkpointing=True,
        checkpointing_every_n_layers=2,
    )
    assert half.training_args["activation_checkpointing_kwargs"] == {"every_n_layers": 2}
    peaks = none.peak_memory_gib, half.peak_memory_gib, every.peak_memory_gib
    print(
        f"\npeak GiB: none {peaks[0]:.3f}, every 2nd block {peaks[1]:.3f}, every block "
        f"{peaks[2]:.3f}; samples/s {none.samples_per_s:.1f}, {half.samples_per_s:.1f}, "
        f"{every.samples_per_s:.1f}"
    )
    # Blocks 1 and 3 keep their activations: the peak holds two blocks' where full
    # checkpointing holds the one it recomputes, and none all four.
    saved = none.peak_memory_gib - every.peak_memory_gib
    assert saved > 0.15, peaks
    assert (
        every.peak_memory_gib + saved / 8 < half.peak_memory_gib < none.peak_memory_gib - saved / 4
    )


@pytest.mark.parametrize("optim", ["adamw_torch_8bit", "adamw_torch_4bit"])
def test_torchaos_low_bit_adamw_trains(tmp_path, launcher, optim):
    result = run(tmp_path, launcher, TINY_MODEL, 32, optim=optim)
    assert result.training_args["optim"] == optim and result.samples_per_s > 0


def test_regional_compilation_compiles_each_block_set_through_the_environment(tmp_path, launcher):
    # The eager backend traces with dynamo but generates no code: the modes, not the compiler.
    regional = run(
        tmp_path / "regional",
        launcher,
        TINY_MODEL,
        32,
        torch_compile="eager",
        compile_regional=True,
    )
    assert regional.environment == {"ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "true"}
    assert regional.compiled_modules >= 2  # the two BERT layers, each its own region
    whole = run(
        tmp_path / "whole", launcher, TINY_MODEL, 32, torch_compile="eager", compile_regional=False
    )
    assert whole.environment == {"ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "false"}
    assert whole.compiled_modules == 1
