"""`autotune estimate` refuses what the search refuses, every problem named at once."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from autotune.cli import estimate as estimate_cli
from autotune.cli.estimate import parse
from autotune.common.device import DeviceInfo
from autotune.common.errors import ConfigError, DeviceError, SpaceError
from autotune.common.knobs import KNOBS
from autotune.plan import hardware, software_cache
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.plan.space_file import SoftwareFacts, parse_space


def test_estimate_device_cuda_without_a_gpu_suggests_memory_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: import fails as without a GPU
    with pytest.raises(DeviceError, match=r"device=cuda memory_budget="):
        hardware.memory_without_torch("cuda")


GIB = 1024**3


FACTS = SoftwareFacts(
    optimizer_names=("adamw_torch", "adamw_torch_fused", "adafactor"),
    compile_backends=("inductor", "eager"),
    model_types=("bert", "gpt2", "t5"),
    task_model_types={"causal-lm": ("gpt2",), "seq2seq": ("t5",)},
    transformers_version="5.x",
)
"""What the installed packages accept, as the software cache would answer (no probe here)."""


REFUSED = {
    "seq_len=2048": "seq_len=2048: gpt2 takes at most 1024 tokens",
    "seq_len=1000000000": "seq_len=1000000000: gpt2 takes at most 1024 tokens",
    "task=seq2seq": "task=seq2seq: transformers has no seq2seq head for gpt2 models",
    "optim=adamw_foo": "optim: 'adamw_foo' is not a TrainingArguments.optim name here; "
    "did you mean adamw_torch?",
    "torch_compile=nonsense": "torch_compile: 'nonsense' is not off or a torch.compile backend "
    "here",
}
"""`autotune estimate model=gpt2 ...`: what it must refuse, in the words it refuses it."""


@pytest.fixture
def run_estimate(monkeypatch: pytest.MonkeyPatch):
    """`autotune estimate model=gpt2 ...` for a 16 GiB GPU (no NVML), the installed packages
    answering FACTS."""
    monkeypatch.setattr(software_cache, "software_facts", lambda: FACTS)

    def run(*overrides: str) -> int:
        settings = ["model=gpt2", "device=cuda", "memory_budget=16GiB", *overrides]
        return estimate_cli.run(argparse.Namespace(overrides=settings))

    return run


@pytest.mark.parametrize("setting", REFUSED)
def test_the_estimate_refuses_what_the_search_refuses_before_any_table(
    run_estimate, capsys: pytest.CaptureFixture[str], setting: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        run_estimate(setting)
    assert str(refused.value) == REFUSED[setting]
    assert capsys.readouterr().out == "", "a table printed for what the search refuses"


def test_every_refusal_is_named_at_once(run_estimate) -> None:
    with pytest.raises(ConfigError) as refused:
        run_estimate("optim=adamw_fused", "seq_len=4096", "task=seq2seq")
    assert str(refused.value).splitlines() == [
        "optim: 'adamw_fused' is not a TrainingArguments.optim name here; "
        "did you mean adamw_torch_fused?",
        "seq_len=4096: gpt2 takes at most 1024 tokens",
        "task=seq2seq: transformers has no seq2seq head for gpt2 models",
    ]


def test_a_missing_model_and_an_unknown_gpu_are_refused_before_the_software_facts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading the installed packages' facts takes seconds the first time (10 s here): what
    needs none of them is refused first, every such problem at once."""

    def facts():
        raise AssertionError("the software facts were read first")

    monkeypatch.setattr(software_cache, "software_facts", facts)
    settings = ["model=no-such-model", "gpu=xH100y"]
    with pytest.raises(ConfigError) as refused:
        estimate_cli.run(argparse.Namespace(overrides=settings))
    first, second = str(refused.value).splitlines()
    assert first.startswith("gpu=xH100y: not in the built-in table (")
    assert second.startswith("model=no-such-model: not in the catalogue")


def test_names_the_installed_packages_offer_still_get_their_table(
    run_estimate, capsys: pytest.CaptureFixture[str]
) -> None:
    # `off` is YAML's false: the estimate reads it as a space does ("no compile").
    assert run_estimate("seq_len=1024", "optim=adafactor", "torch_compile=off") == 0
    assert "largest batch that fits" in capsys.readouterr().out


@pytest.mark.parametrize("setting", REFUSED)
def test_the_search_refuses_it_in_the_same_words(
    run_estimate, tmp_path: Path, setting: str
) -> None:
    """Settings the search takes on its command line (its plan); knobs, in its space file."""
    with pytest.raises(ConfigError) as estimate_refused:
        run_estimate(setting)
    key, value = setting.split("=")
    if key in KNOBS:
        with pytest.raises(SpaceError) as refused:
            parse_space({"knobs": {key: value}}, name="s", source="s.yaml", facts=FACTS)
    else:
        device = DeviceInfo(
            cuda_available=False,
            name="cpu",
            total_memory_bytes=16 * GIB,
            free_memory_bytes=16 * GIB,
            host_available_memory_bytes=16 * GIB,
            optimizer_names=FACTS.optimizer_names,
            compile_backends=FACTS.compile_backends,
            model_types=FACTS.model_types,
            task_model_types=FACTS.task_model_types,
            transformers_version=FACTS.transformers_version,
        )
        with pytest.raises(ConfigError) as refused:
            make_plan(load_config(["model=gpt2", f"out={tmp_path}", setting]), device)
    # The space names the knob by its path in the file: knobs.optim: 'adamw_foo' is not ...
    assert str(estimate_refused.value).removeprefix(f"{key}: ") in str(refused.value)


def test_the_software_cache_answers_model_types_cold_and_warm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The estimate's model checks read the per-user cache; a stand-in probe fills it."""
    monkeypatch.setenv(software_cache.CACHE_DIR_ENV, str(tmp_path))
    probed = DeviceInfo(
        cuda_available=False,
        name="cpu",
        total_memory_bytes=GIB,
        free_memory_bytes=GIB,
        transformers_version="5.x",
        model_types=("gpt2",),
        task_model_types={"causal-lm": ("gpt2",)},
        optimizer_names=("adamw_torch",),
    )
    calls = []
    monkeypatch.setattr(hardware, "probe", lambda **known: calls.append(known) or probed)
    cold, warm = software_cache.software_facts(), software_cache.software_facts()
    assert len(calls) == 1, "the second answer comes from the cache"
    for facts in (cold, warm):
        assert facts.model_types == ("gpt2",)
        assert facts.task_model_types == {"causal-lm": ("gpt2",)}
        assert facts.transformers_version == "5.x"
        assert facts.compile_backends is None, "a list the probe did not read: no check"


def test_knobs_and_settings_are_checked_together():
    config, knobs = parse(["model=gpt2", "seq_len=1024", "precision=bf16", "batch_size=4"])
    assert config.seq_len == 1024 and knobs == {"precision": "bf16", "batch_size": 4}
    with pytest.raises(ConfigError) as error:
        parse(["model=gpt2", "precision=fp64", "seq_lenn=3", "gradient_checkpointing=maybe"])
    message = str(error.value)
    assert "precision=fp64: expected one of" in message
    assert "seq_lenn: unknown key; did you mean seq_len?" in message
    assert "gradient_checkpointing=maybe: expected true or false" in message


def test_gpu_names_a_gpu_whole_never_by_a_piece():
    from autotune.cli.estimate import named_gpu_memory_bytes

    h100 = named_gpu_memory_bytes("H100")
    assert h100 == 81_559 * 2**20
    assert named_gpu_memory_bytes("NVIDIA H100 80GB HBM3") == h100  # the twin's, NVML's name
    assert named_gpu_memory_bytes("a100 80gb") == 81_920 * 2**20  # case, spaces and hyphens
    assert named_gpu_memory_bytes("T4") == 15_360 * 2**20  # the table's, not the twin's
    for piece in ("A100,H100", "xH100y", "H10", "NVIDIA"):
        assert named_gpu_memory_bytes(piece) is None, piece
