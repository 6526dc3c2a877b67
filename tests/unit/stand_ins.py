"""Stand-ins the unit tests share: a CPU machine as the probe would describe it, plans for it,
knob settings that ran out of memory, a password."""

import dataclasses

from autotune.common.device import DeviceInfo
from autotune.common.units import GIB
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from tests.conftest import TINY_MODEL

CPU = DeviceInfo(
    cuda_available=False,
    name="cpu",
    total_memory_bytes=2**34,
    free_memory_bytes=2**34,
    cpu_name="cpu",
    host_available_memory_bytes=2**34,
    transformers_version="5.x",
    bf16_supported=True,  # a CPU with bf16 instructions (AVX-512 BF16 or AMX)
    model_types=("bert", "gpt2", "t5"),
    task_model_types={"seq2seq": ("t5",), "sequence-classification": ("bert", "gpt2", "t5")},
)


def plan_for(tmp_path, *overrides, **device_facts):
    """The plan of a search with these `key=value` overrides, on the stand-in CPU with these
    facts changed."""
    info = dataclasses.replace(CPU, **device_facts)
    return make_plan(load_config([f"model={TINY_MODEL}", f"out={tmp_path}", *overrides]), info)


def machine(available_gib: float, total_gib: float = 24, cuda: bool = False) -> DeviceInfo:
    available, total = int(available_gib * GIB), int(total_gib * GIB)
    return DeviceInfo(
        cuda_available=cuda,
        name="gpu" if cuda else "cpu",
        total_memory_bytes=80 * GIB,
        free_memory_bytes=80 * GIB if cuda else available,
        cpu_name="cpu",
        host_available_memory_bytes=available,
        host_total_memory_bytes=total,
        cuda_free_memory_bytes=(80 * GIB,) if cuda else (),
        cuda_device_names=("gpu",) * cuda,
    )


GPUS = dataclasses.replace(
    CPU,
    cuda_available=True,
    name="NVIDIA H100 80GB HBM3",
    cuda_device_names=("NVIDIA H100 80GB HBM3",) * 4,
    cuda_free_memory_bytes=(80 * 2**30, 70 * 2**30, 79 * 2**30, 80 * 2**30),
)


OOM = {"batch_size": 32, "gradient_checkpointing": False, "precision": "bf16", "optim": "sgd"}


SECRET = "s3cret"
