"""The evidence behind `strategy=pp`'s refusal (`knob_values.PIPELINE_REFUSAL`), clause by
clause against the installed packages: the day one stops being true, this fails, and the
refusal is to be revisited. transformers' own pipeline split is run on 2 gloo ranks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import transformers
from accelerate.parallelism_config import ParallelismConfig

from tests.gloo_ranks import two_ranks

pytestmark = pytest.mark.slow

RANK = r"""
import json, os, sys
import torch, torch.distributed as dist
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig

folder, out = sys.argv[1], sys.argv[2]
join()  # tests/gloo_ranks.py: the group, on loopback
split = DistributedConfig(pp_size=2)
model = AutoModelForCausalLM.from_pretrained(folder, distributed_config=split)
ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
output = model(input_ids=ids, labels=ids)
facts = {"loss": None if output.loss is None else float(output.loss)}
try:
    output.logits.sum().backward()
    facts["backward"] = "ok"
except RuntimeError as error:
    facts["backward"] = str(error)
with open(f"{out}/rank{dist.get_rank()}.json", "w") as f:
    json.dump(facts, f)
dist.destroy_process_group()
"""


def test_the_trainer_and_accelerate_have_no_pipeline_setting():
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    assert not {f for f in fields if "pipeline" in f or f.startswith("pp_")}, fields
    sizes = {f.name for f in dataclasses.fields(ParallelismConfig) if f.name.endswith("_size")}
    # Data (replicated, sharded), tensors, context and sequences; no layers.
    assert sizes == {"dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size"}


def test_transformers_pipeline_split_returns_no_loss_to_train_on(tmp_path: Path):
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    two_ranks(RANK, str(tmp_path / "model"), str(tmp_path), timeout_s=300)
    facts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # The model is split and runs forward, but no rank has a loss; the first stage's output
    # is not even part of a graph to train.
    assert [f["loss"] for f in facts] == [None, None]
    assert "does not require grad" in facts[0]["backward"]
