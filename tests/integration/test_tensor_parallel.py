"""`strategy=tp` on CPU: what CPU can show of it. The model autotune's ranks build split by
its tensor-parallel plan (`child/models._tensor_parallel`) on 2 gloo ranks: each rank's share
of the weights, losses and gradient norms equal to one process's on the same weights; the
clipping the Trainer does through accelerate (per device mesh) where torch's own over every
parameter fails; and a tp trial launched through the worker as any trial, which loads its
split model and ends at the Trainer's setup with accelerate's refusal of a CPU run
(`knob_values.TENSOR_PARALLEL_ON_CPU`, the capability filter's reason). On CUDA the same
trial trains."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from autotune.common.models import resolve_model
from autotune.common.trial import Status, TrialResult, TrialSpec
from autotune.execute.launchers import ForkserverLauncher
from autotune.execute.local import launch_trial
from autotune.outputs.launch import launch_command
from autotune.outputs.script import render_script
from autotune.store.records import TrialRecord
from tests.gloo_ranks import two_ranks
from tests.unit.outputs.test_script import run_info

pytestmark = pytest.mark.slow

TINY_LLAMA = str(Path(__file__).parents[2] / "examples" / "tiny-llama")

RANK = r"""
import json, sys
import torch, torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor
from accelerate import Accelerator
from autotune.child.models import build_model
from autotune.common.models import ModelSpec, resolve_model

folder, out = sys.argv[1], sys.argv[2]
join()  # tests/gloo_ranks.py: the group, on loopback
found = resolve_model(folder)
spec = ModelSpec(name=found.name, source="spec", config=found.config)
torch.manual_seed(0)
alone = build_model(spec, "causal-lm", dtype="float32")
split = build_model(spec, "causal-lm", dtype="float32", tensor_parallel=(2, 1))
facts = {"tp_size": split.tp_size, "shards": {}}
with torch.no_grad():  # the weights of the model alone, each rank its share of them
    for name, p in split.named_parameters():
        full = alone.get_parameter(name)
        if isinstance(p, DTensor):
            mine = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
            p.to_local().copy_(mine.to_local())
            facts["shards"][name] = [list(p.to_local().shape), list(full.shape)]
        else:
            p.copy_(full)
ids = torch.randint(0, 500, (4, 32), generator=torch.Generator().manual_seed(1))
clip = Accelerator._clip_grad_norm_dtensor_aware  # what the Trainer's clipping calls
for label, model in (("alone", alone), ("split", split)):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, norms = [], []
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if label == "split" and not norms:
            try:
                torch.nn.utils.clip_grad_norm_(list(model.parameters()), float("inf"))
                facts["torch_clip"] = "ok"
            except RuntimeError as error:
                facts["torch_clip"] = str(error)
        norms.append(float(clip(None, list(model.parameters()), 1.0)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    facts[label] = {"losses": losses, "norms": norms}
local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in split.parameters())
facts["local_parameters"] = local
facts["full_parameters"] = sum(p.numel() for p in alone.parameters())
with open(f"{out}/rank{dist.get_rank()}.json", "w") as f:
    json.dump(facts, f)
dist.destroy_process_group()
"""


def test_the_split_model_trains_as_one_process_does_on_the_same_weights(tmp_path: Path):
    two_ranks(RANK, TINY_LLAMA, str(tmp_path))
    facts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in facts:
        assert rank["tp_size"] == 2
        # Every block's attention and MLP projections are split in two (columns or rows, as
        # the plan says), the embedding too; nothing else is a shard.
        for local, full in rank["shards"].values():
            assert sorted(local) != sorted(full) and local[0] * local[1] * 2 == full[0] * full[1]
        projections = {n.rsplit(".", 2)[-2] for n in rank["shards"] if ".layers." in n}
        assert projections == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                               "down_proj"}  # fmt: skip
        # Each rank holds about half the model: the norms' few weights are whole on both.
        assert (
            rank["full_parameters"] // 2 < rank["local_parameters"] < rank["full_parameters"] * 0.51
        )
        # Losses and gradient norms match one process's on the same weights and batches.
        assert rank["split"]["losses"] == pytest.approx(rank["alone"]["losses"], rel=1e-5)
        assert rank["split"]["norms"] == pytest.approx(rank["alone"]["norms"], rel=1e-5)
        assert rank["alone"]["norms"][0] > 1.0  # so the clipping at 1.0 did clip
        # torch's own clipping over every parameter refuses the mix of DTensors and
        # tensors; accelerate's (the Trainer's) takes each device mesh apart.
        assert "mixed torch.Tensor and DTensor" in rank["torch_clip"]
    assert facts[0]["split"] == facts[1]["split"]


def test_a_tp_trial_launches_its_ranks_and_meets_accelerate_s_refusal_on_cpu(tmp_path: Path):
    model = resolve_model(TINY_LLAMA)
    spec = TrialSpec(
        trial_number=0,
        model_name=model.name,
        model_config=model.config,
        task="causal-lm",
        seq_len=32,
        device="cpu",
        params={"batch_size": 4, "precision": "fp32", "optim": "adamw_torch", "strategy": "tp"},
        warmup_steps=1,
        measure_steps=2,
        seed=0,
        devices=2,
    )
    result = launch_trial(spec, tmp_path, timeout_s=600, launcher=ForkserverLauncher())
    # The ranks joined, built their split model and reached the Trainer, whose accelerator
    # refuses tensor parallelism on CPU processes: the refusal the capability filter names.
    assert result.status is Status.ERROR, result.reason
    assert result.reason.startswith("rank ")
    assert "ParallelismConfig" in result.reason and "MULTI_CPU" in result.reason, result.reason


def test_the_exported_script_builds_the_split_model_under_torchrun(tmp_path: Path):
    """recommended.py of a tp trial, run as `launch` says, builds each rank's share of the
    model by its plan and hands it to the Trainer: on CPU, accelerate's refusal again (on CUDA
    it trains)."""
    model = resolve_model(TINY_LLAMA)
    info = dataclasses.replace(
        run_info("x"),
        model=model.name,
        model_config=model.config,
        task="causal-lm",
        adapter=None,
        data=None,
        trainer=None,
        devices_per_trial=2,
    )
    args = {"per_device_train_batch_size": 2, "use_cpu": True, "optim": "adamw_torch"}
    result = TrialResult(
        status=Status.OK, samples_per_s=1.0, peak_memory_gib=1.0, training_args=args
    )
    record = TrialRecord(number=1, params={"strategy": "tp", "batch_size": 2}, result=result)
    script = render_script(info, record)
    assert "STRATEGY = 'tp'" in script and "TP_SIZE = 2" in script
    (tmp_path / "recommended.py").write_text(script)
    launch = launch_command(info, record.params)
    assert launch == "torchrun --standalone --nproc_per_node=2 recommended.py"
    run = subprocess.run(
        [*shlex.split(launch), "--max-steps", "1", "--output-dir", str(tmp_path / "out")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode != 0
    assert "ParallelismConfig is only compatible" in run.stderr, run.stderr[-3000:]
    assert "MULTI_CPU" in run.stderr
