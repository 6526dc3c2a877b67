"""How a trial on several ranks is judged: the strategy asked must be the one that trained, and
the first rank to end badly names the trial."""

import json
import os
import types

import pytest
import torch

from autotune.child.rank_training import StrategyNotApplied, _check_applied, check_data_parallel
from autotune.child.ranks import Rank, _rank_failure, own_device_first
from autotune.common.trial import Status, TrialResult

FULL = 1001


def test_ddp_is_each_rank_holding_every_parameter_inside_distributed_data_parallel():
    _check_applied(Rank(0, 2, "ddp"), [FULL, FULL], FULL, ["DistributedDataParallel"] * 2)


def test_a_trainer_that_did_not_wrap_the_model_is_no_ddp():
    # What the stock Trainer does on CPU when asked for FSDP: a plain, unwrapped model.
    with pytest.raises(StrategyNotApplied, match=r"ddp asked, but the ranks trained"):
        _check_applied(Rank(0, 2, "ddp"), [FULL, FULL], FULL, ["BertModel"] * 2)


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp_grad_op"])
def test_sharding_is_the_ranks_holding_the_parameters_between_them(strategy):
    _check_applied(Rank(1, 2, strategy), [501, 500], FULL, ["FSDPBertModel"] * 2)
    with pytest.raises(StrategyNotApplied, match=r"holding \[1001, 1001\] of 1001 parameters"):
        _check_applied(Rank(1, 2, strategy), [FULL, FULL], FULL, ["BertModel"] * 2)
    # The stock Trainer's FSDP path on CPU: DDP, every parameter on every rank.
    with pytest.raises(StrategyNotApplied, match=r"trained \['DistributedDataParallel'"):
        _check_applied(Rank(1, 2, strategy), [FULL, FULL], FULL, ["DistributedDataParallel"] * 2)


@pytest.mark.parametrize(("strategy", "stage"), [("zero1", 1), ("zero2", 2), ("zero2_offload", 2)])
def test_zero_1_and_2_are_deepspeeds_engine_at_the_stage_asked_holding_every_parameter(
    strategy, stage
):
    engine = f"DeepSpeedEngine ZeRO-{stage}"
    _check_applied(Rank(0, 2, strategy), [FULL, FULL], FULL, [engine] * 2)
    other = "DeepSpeedEngine ZeRO-1" if stage == 2 else "DeepSpeedEngine ZeRO-2"
    with pytest.raises(StrategyNotApplied, match=rf"{strategy} asked, but the ranks trained"):
        _check_applied(Rank(0, 2, strategy), [FULL, FULL], FULL, [engine, other])
    with pytest.raises(StrategyNotApplied, match=r"trained \['DistributedDataParallel'"):
        _check_applied(Rank(0, 2, strategy), [FULL, FULL], FULL, ["DistributedDataParallel"] * 2)


@pytest.mark.parametrize("strategy", ["zero3", "zero3_offload"])
def test_zero_3_is_each_rank_holding_a_padded_partition(strategy):
    engine = "DeepSpeedEngine ZeRO-3"
    _check_applied(Rank(0, 2, strategy), [501, 501], FULL, [engine] * 2)  # padded: 1002
    with pytest.raises(StrategyNotApplied, match=r"holding \[1001, 1001\]"):
        _check_applied(Rank(0, 2, strategy), [FULL, FULL], FULL, [engine] * 2)
    with pytest.raises(StrategyNotApplied, match=r"holding \[400, 400\]"):  # some lost
        _check_applied(Rank(0, 2, strategy), [400, 400], FULL, [engine] * 2)


def test_single_is_one_rank_under_no_wrapper():
    _check_applied(Rank(0, 1, "single"), [FULL], FULL, ["BertModel"])
    with pytest.raises(StrategyNotApplied, match="single asked"):
        _check_applied(Rank(0, 1, "single"), [FULL], FULL, ["DeepSpeedEngine ZeRO-1"])


def test_a_rank_that_wrote_its_failure_names_the_trial_with_its_number(tmp_path):
    oom = TrialResult(status=Status.OOM, reason="OutOfMemoryError: 2 GiB", stderr_tail="trace")
    (tmp_path / "rank1.json").write_text(json.dumps(oom.to_dict()))
    result = _rank_failure(1, 1, tmp_path)
    assert (result.status, result.reason) == (Status.OOM, "rank 1: OutOfMemoryError: 2 GiB")
    assert result.stderr_tail == "trace"


@pytest.mark.parametrize(("code", "says"), [(-9, "was killed by SIGKILL"), (3, "exited with 3")])
def test_a_rank_that_died_silently_is_a_crash_named_by_its_end(tmp_path, code, says):
    result = _rank_failure(0, code, tmp_path)
    assert (result.status, result.reason) == (Status.CRASHED, f"rank 0 {says}")


def test_offload_on_a_gpu_is_the_states_found_in_host_memory():
    gpu = Rank(0, 1, "zero3_offload", on_cuda=True)
    both = "DeepSpeedEngine ZeRO-3 optimizer on host parameters on host"
    _check_applied(gpu, [FULL], FULL, [both])  # one rank on one GPU holds every parameter
    with pytest.raises(StrategyNotApplied, match="zero3_offload asked, but the ranks trained"):
        _check_applied(gpu, [FULL], FULL, ["DeepSpeedEngine ZeRO-3 optimizer on host"])
    zero2 = Rank(0, 1, "zero2_offload", on_cuda=True)
    _check_applied(zero2, [FULL], FULL, ["DeepSpeedEngine ZeRO-2 optimizer on host"])
    with pytest.raises(StrategyNotApplied, match="zero2_offload asked"):
        _check_applied(zero2, [FULL], FULL, ["DeepSpeedEngine ZeRO-2"])  # kept on the GPU


def test_fsdp_offload_on_a_gpu_is_every_rank_holding_its_shards_in_host_memory():
    gpu = Rank(1, 2, "fsdp_offload", on_cuda=True)
    _check_applied(gpu, [501, 500], FULL, ["FSDPBertModel parameters on host"] * 2)
    with pytest.raises(StrategyNotApplied, match="fsdp_offload asked, but the ranks trained"):
        _check_applied(gpu, [501, 500], FULL, ["FSDPBertModel parameters on host", "FSDPBertModel"])
    # fsdp keeps its shards on the GPU: shards found on the host are not what it asked.
    with pytest.raises(StrategyNotApplied, match="fsdp asked"):
        _check_applied(
            Rank(1, 2, "fsdp", on_cuda=True),
            [501, 500],
            FULL,
            ["FSDPBertModel parameters on host"] * 2,
        )
    # Its group reduces on the host too (the gradients' norm), over gloo beside NCCL.
    assert gpu.backend == "cpu:gloo,cuda:nccl"
    assert Rank(0, 2, "fsdp", on_cuda=True).backend == "nccl"
    assert Rank(0, 2, "fsdp").backend == "gloo"


def test_a_sharding_rank_lists_its_own_gpu_first_and_keeps_the_others_visible(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert own_device_first(Rank(2, 4, "fsdp", on_cuda=True)) == 0
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,4,5,7"


def test_a_rank_torchrun_started_learns_who_it_is_from_its_environment():
    rank = Rank.from_torchrun(
        "fsdp", {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, on_cuda=True
    )
    assert rank == Rank(3, 8, "fsdp", on_cuda=True)
    assert rank.fsdp and rank.backend == "nccl" and not rank.trainer_distributed


def test_a_dp_trial_is_the_trainers_data_parallel_over_every_gpu_it_asked():
    def trainer(wrapped, n_gpu):
        return types.SimpleNamespace(model_wrapped=wrapped, args=types.SimpleNamespace(n_gpu=n_gpu))

    layer = torch.nn.Linear(2, 2)
    check_data_parallel(trainer(torch.nn.DataParallel(layer), 2), 2)
    # One GPU seen (the Trainer does not wrap), or fewer than asked: a silent fallback.
    trained = r"dp asked, but the Trainer trained Linear on n_gpu=1 of the trial's 2 GPUs"
    with pytest.raises(StrategyNotApplied, match=trained):
        check_data_parallel(trainer(layer, 1), 2)
    with pytest.raises(StrategyNotApplied, match="n_gpu=2 of the trial's 4 GPUs"):
        check_data_parallel(trainer(torch.nn.DataParallel(layer), 2), 4)
