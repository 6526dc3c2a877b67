"""`strategy=dp`: DataParallel over a trial's GPUs from one process. Searched beside DDP on
several GPUs, gone from a CPU search with its reason; no ranks forked for it; GPU 0 holds
every GPU's outputs; the twin prices its copies over the link."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.child import ranks
from autotune.common.errors import SpaceError
from autotune.common.models import resolve_model
from autotune.common.trial import TrialSpec
from autotune.plan.capabilities import fit_to_nodes
from autotune.plan.estimate import estimate
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.plan.space import SearchSpace, SpaceKnob
from autotune.twin import model as twin
from tests.conftest import TINY_MODEL
from tests.unit.child.test_trainers import cuda_spec
from tests.unit.stand_ins import GPUS, plan_for

GPT2 = resolve_model("gpt2").config


def test_dp_is_searched_beside_ddp_on_several_gpus(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = load_config([f"model={TINY_MODEL}", f"out={tmp_path}", "devices_per_trial=2"])
    strategies = make_plan(config, GPUS).space.knobs["strategy"].choices
    assert {"ddp", "dp"} <= set(strategies)


def test_dp_leaves_a_cpu_search_with_its_reason(tmp_path):
    plan = plan_for(tmp_path, "devices_per_trial=2", "workers=1")
    assert "dp" not in plan.space.knobs["strategy"].choices
    assert (
        "removed strategy=dp: DataParallel drives the CUDA devices one process sees: on CPU "
        "there are none"
    ) in plan.space.notes


def spec(strategy: str, devices: int = 2) -> TrialSpec:
    return dataclasses.replace(cuda_spec(strategy=strategy), devices=devices)


def test_a_dp_trial_is_one_process_and_every_other_strategy_ranks():
    assert not ranks.needed(spec("dp"))
    assert ranks.data_parallel(spec("dp")) and not ranks.data_parallel(spec("ddp"))
    assert ranks.needed(spec("ddp")) and ranks.needed(spec("single"))  # single: one rank of 2


def test_gpu_0_of_a_dp_trial_holds_every_gpus_logits():
    def at(strategy):
        params = {"strategy": strategy, "batch_size": 4, "precision": "bf16"}
        return estimate(
            GPT2, task="causal-lm", seq_len=1024, params=params, device="cuda", devices=2
        )

    dp, ddp = at("dp"), at("ddp")
    assert dp.logits == 2 * ddp.logits
    assert dp.weights == ddp.weights and dp.optimizer == ddp.optimizer  # a whole replica


def test_the_twin_prices_dps_copies_on_the_link_and_its_one_process():
    def step_s(strategy, gpu):
        params = {"strategy": strategy, "batch_size": 8, "precision": "bf16"}
        shape = twin.shape_of(GPT2, None, None)
        return twin.step(gpu, shape, task="causal-lm", seq_len=1024, params=params, devices=2)

    h100 = twin.gpu("H100")
    over_pcie = dataclasses.replace(h100, link=twin.gpu("L4").link)
    # Over NVLink DataParallel is slower than DDP, as the guide measured (110 s against 101 s).
    assert step_s("dp", h100).seconds > step_s("ddp", h100).seconds
    # Its copies cross the link: a slower one costs it more.
    assert step_s("dp", over_pcie).device_s > step_s("dp", h100).device_s
    # One process launches both replicas' kernels (the optimizer's, on GPU 0, once).
    assert step_s("dp", h100).host_s == pytest.approx(2 * step_s("single", h100).host_s, rel=0.01)


def test_a_trial_across_nodes_cannot_be_dp():
    knobs = {"strategy": SpaceKnob(name="strategy", choices=("ddp", "dp"))}
    space = SearchSpace(name="s", description="", device="any", knobs=knobs)
    assert fit_to_nodes(space, 1) is space
    across = fit_to_nodes(space, 2)
    assert across.knobs["strategy"].choices == ("ddp",)
    assert across.notes == (
        "removed strategy=dp: DataParallel is one process, and a trial here spans 2 nodes",
    )
    with pytest.raises(SpaceError, match="dp is one process, and a trial here spans 2 nodes"):
        fit_to_nodes(space.with_choices("strategy", ("dp",)), 2)


def test_a_dp_trial_s_process_is_one_the_trainer_runs_dataparallel_in(tmp_path, monkeypatch):
    """Planned on faked CUDA facts (4 GPUs, 2 a trial) and its arguments made as the trial
    makes them, in the environment its placement gives it: the Trainer's `n_gpu` is the
    trial's 2 GPUs in one process, which is when it wraps the model in DataParallel."""
    import torch
    import transformers

    from autotune.child import trainers
    from autotune.common import knobs

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = load_config(
        [f"model={TINY_MODEL}", f"out={tmp_path}", "devices_per_trial=2", "workers=2"]
    )
    plan = make_plan(config, GPUS)
    assert "dp" in plan.space.knobs["strategy"].choices
    env = plan.slots[1].environment({})
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"  # the second worker's GPUs
    visible = env["CUDA_VISIBLE_DEVICES"].split(",")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(visible))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    trial = spec("dp")
    tuned = knobs.training_args(trial.params, device="cuda", fields=trainers.ARG_FIELDS)
    args = trainers.training_arguments(trial, tuned, str(tmp_path))
    assert args.n_gpu == 2 and args.device == torch.device("cuda:0")
    # NOT_DISTRIBUTED: several GPUs in one process (NOT_PARALLEL is one device).
    assert args.parallel_mode is transformers.training_args.ParallelMode.NOT_DISTRIBUTED
