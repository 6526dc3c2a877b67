"""A rank's model states by strategy follow ZeRO's accounting (Rajbhandari et al. 2020)."""

import pytest

from autotune.common.models import catalogue_parameter_counts, resolve_model
from autotune.plan.estimate import estimate

BERT_LARGE = resolve_model("bert-large-uncased")
PARAMETERS = catalogue_parameter_counts()["bert-large-uncased"]


def per_rank(strategy: str | None, devices: int):
    params = {"optim": "adamw_torch", "batch_size": 8} | (
        {"strategy": strategy} if strategy else {}
    )
    return estimate(
        BERT_LARGE.config,
        task="sequence-classification",
        seq_len=512,
        params=params,
        device="cuda",
        parameters=PARAMETERS,
        devices=devices,
    )


def test_per_rank_model_states_follow_zeros_accounting():
    p = PARAMETERS
    assert per_rank(None, 1).model_states == 16 * p  # AdamW: weights, gradients, two states
    assert per_rank("ddp", 8).model_states == 16 * p  # replicated on every rank
    assert per_rank("fsdp", 8).model_states == pytest.approx(16 * p / 8, abs=16)
    assert per_rank("fsdp_grad_op", 8).model_states == per_rank("fsdp", 8).model_states


def test_per_rank_peaks_order_the_strategies_by_what_each_rank_holds():
    single, ddp = per_rank(None, 1), per_rank("ddp", 8)
    grad_op, full_shard = per_rank("fsdp_grad_op", 8), per_rank("fsdp", 8)
    assert ddp.gradients == 2 * single.gradients  # DDP's buckets copy the gradients
    assert ddp.total > single.total > grad_op.total > full_shard.total
    assert full_shard.optimizer == single.optimizer // 8
    assert grad_op.activations == full_shard.activations == single.activations


def test_zero_stages_follow_zeros_accounting_in_mixed_precision_and_fp32():
    p, n = PARAMETERS, 8

    def states(strategy, precision):
        params = {
            "optim": "adamw_torch",
            "batch_size": 8,
            "precision": precision,
            "strategy": strategy,
        }
        return estimate(
            BERT_LARGE.config,
            task="sequence-classification",
            seq_len=512,
            params=params,
            device="cuda",
            parameters=p,
            devices=n,
        )

    # Rajbhandari et al.: 16-bit weights and gradients, fp32 copy + AdamW's states (12 Psi).
    assert states("zero1", "bf16").model_states == pytest.approx(4 * p + 12 * p / n, abs=64)
    assert states("zero2", "bf16").model_states == pytest.approx(2 * p + 14 * p / n, abs=64)
    assert states("zero3", "bf16").model_states == pytest.approx(16 * p / n, abs=64)
    # In fp32 DeepSpeed's copy is 4 more bytes of the partition: 20 Psi in all.
    assert states("zero3", "fp32").model_states == pytest.approx(20 * p / n, abs=64)
    assert states("zero1", "fp32").model_states == pytest.approx(8 * p + 12 * p / n, abs=64)
    # Offload keeps the same states, but the optimizer's part in host memory, out of the peak.
    on_gpu, offloaded = states("zero2", "bf16"), states("zero2_offload", "bf16")
    assert offloaded.offloaded > 12 * p / n and offloaded.optimizer == 0
    assert offloaded.total < on_gpu.total
    assert states("zero3_offload", "bf16").total < offloaded.total  # the weights too


def test_fsdp_offload_keeps_every_shard_on_the_host():
    p, n = PARAMETERS, 8
    sharded, offloaded = per_rank("fsdp", n), per_rank("fsdp_offload", n)
    assert offloaded.model_states == sharded.model_states  # the same 16 Psi / N, elsewhere
    assert offloaded.offloaded == offloaded.model_states == pytest.approx(16 * p / n, abs=16)
    assert offloaded.optimizer == 0 and offloaded.total < sharded.total
    # What stays on the device: the gathered blocks and one block's gradients, not the 8 Psi / N
    # of weight and gradient shards.
    on_device = sharded.weights + sharded.gradients - 8 * p / n
    assert offloaded.weights + offloaded.gradients == pytest.approx(on_device, abs=16)


def test_ddps_gradients_as_bucket_views_drop_the_buckets_copy():
    params = {
        "optim": "adamw_torch",
        "batch_size": 8,
        "strategy": "ddp",
        "gradient_as_bucket_view": True,
    }
    viewed = estimate(
        BERT_LARGE.config,
        task="sequence-classification",
        seq_len=512,
        params=params,
        device="cuda",
        parameters=PARAMETERS,
        devices=8,
    )
    copied, single = per_rank("ddp", 8), per_rank(None, 1)
    assert viewed.gradients == single.gradients == copied.gradients // 2
    assert viewed.total == copied.total - 4 * PARAMETERS
