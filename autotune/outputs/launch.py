"""How the exported script runs as its trial ran: the processes the trial trained with, the
command that starts them (`python recommended.py`, or torchrun with a process per device), and
for `accelerate launch` the accelerate_config.yaml that starts as many. recommended.json,
recommended.py and the printout after a search name the same commands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from autotune.common.knobs import value_of
from autotune.common.layout import ACCELERATE_YAML, RECOMMENDED_PY

if TYPE_CHECKING:  # types only
    from autotune.plan.run_info import RunInfo


ONE_PROCESS = ("single", "dp")
"""Strategies a trial trains in one process: one device, or DataParallel over every GPU it
sees."""


def ranks(info: RunInfo, params: dict[str, Any]) -> int:
    """The processes a trial trained with: one per device, one under `single` and `dp`."""
    return 1 if strategy(info, params) in ONE_PROCESS else info.devices_per_trial or 1


def strategy(info: RunInfo, params: dict[str, Any]) -> str:
    """How the trial's ranks shared the training (`single` where it ran on one device)."""
    return value_of(params, "strategy", devices=info.devices_per_trial or 1)


def launch_command(info: RunInfo, params: dict[str, Any]) -> str:
    """How the exported script runs as the trial did: one process per device it used, under
    torchrun for any strategy but `single` and `dp` (ZeRO-Offload on one GPU too: DeepSpeed
    needs the launcher's environment); `dp` as one process that sees the trial's GPUs."""
    if strategy(info, params) == "dp":
        visible = ",".join(str(i) for i in range(info.devices_per_trial or 1))
        return f"CUDA_VISIBLE_DEVICES={visible} python {RECOMMENDED_PY}"
    if strategy(info, params) == "single":
        return f"python {RECOMMENDED_PY}"
    return f"torchrun --standalone --nproc_per_node={ranks(info, params)} {RECOMMENDED_PY}"


def accelerate_command(info: RunInfo, params: dict[str, Any]) -> str | None:
    """`launch_command` through `accelerate launch` and accelerate_config.yaml; None where
    the trial ran as one process."""
    if strategy(info, params) in ONE_PROCESS:
        return None
    return f"accelerate launch --config_file {ACCELERATE_YAML} {RECOMMENDED_PY}"


def accelerate_config(
    training_args: dict[str, Any], processes: int | None, environment: dict[str, str] | None = None
) -> str | None:
    """accelerate_config.yaml for a trial on `processes` ranks (None: one process, no file):
    accelerate's multi-process launcher (torchrun's, which it runs), on CPU too, and the
    trial's mixed precision (fp8 from its `environment`). Everything else is the script's: its
    TrainingArguments, and FSDP2 sharding by the script itself (accelerate's own FSDP would
    wrap the model a second time)."""
    if processes is None:
        return None
    precision = (environment or {}).get("ACCELERATE_MIXED_PRECISION") or next(
        (p for p in ("bf16", "fp16") if training_args.get(p)), "no"
    )
    config = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_GPU",
        "num_machines": 1,
        "machine_rank": 0,
        "num_processes": processes,
        "mixed_precision": precision,
        "use_cpu": False,  # true would run one process; the script's arguments pick the CPU
    }
    return (
        f"# accelerate launch --config_file {ACCELERATE_YAML} {RECOMMENDED_PY}: one process "
        "a rank, as its trial ran.\n"
        "# The training settings are the script's own (TrainingArguments, FSDP2 sharding).\n"
        + yaml.safe_dump(config, sort_keys=False)
    )
