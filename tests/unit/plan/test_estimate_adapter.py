"""The estimate of an adapter's job (`peft=lora`): a frozen base holds no gradients or optimizer
states, a quantized base its own bytes a weight, the adapter's parameters as peft counts them,
the logits as a part of their own."""

import pytest

from autotune.common.adapter import lora_config
from autotune.common.models import catalogue_parameter_counts, resolve_model
from autotune.plan.estimate import estimate, flops_per_sample, shape_of
from autotune.plan.model_states import NF4_BYTES

LLAMA_8B = "meta-llama/Llama-3.1-8B"
CONFIG = resolve_model(LLAMA_8B).config
PARAMETERS = catalogue_parameter_counts()[LLAMA_8B]


def lora(r: int = 16, targets: str | list[str] = "all-linear", dropout: float = 0.05) -> dict:
    return lora_config(r=r, alpha=2 * r, dropout=dropout, targets=targets, task="causal-lm")


def llama_8b(params: dict, adapter: dict | None = None, seq_len: int = 2048):
    return estimate(
        CONFIG,
        task="causal-lm",
        seq_len=seq_len,
        params={"batch_size": 1, "optim": "adamw_torch_fused"} | params,
        device="cuda",
        parameters=PARAMETERS,
        adapter=adapter,
    )


@pytest.mark.parametrize(
    ("r", "targets", "trainable"),
    [
        # What peft's print_trainable_parameters() prints for Llama-3(.1)-8B.
        (16, "all-linear", 41_943_040),
        (8, ["q_proj", "v_proj"], 3_407_872),
    ],
)
def test_the_adapter_has_the_parameters_peft_counts(r, targets, trainable):
    assert shape_of(CONFIG, PARAMETERS, lora(r, targets)).adapter_parameters == trainable


def test_a_frozen_base_holds_no_gradients_and_no_optimizer_states():
    trained = 41_943_040
    full = llama_8b({})
    adapter = llama_8b({}, lora())
    # fp32 gradients and AdamW's two fp32 moments of the adapter's parameters alone.
    assert adapter.gradients == 4 * trained
    assert adapter.optimizer == 8 * trained
    assert full.gradients == 4 * PARAMETERS and full.optimizer == 8 * PARAMETERS
    # The base in fp32 and the adapter beside it; nothing of the base's gradients or states.
    assert adapter.weights == 4 * PARAMETERS + 4 * trained
    assert adapter.model_states == 4 * PARAMETERS + 16 * trained
    assert adapter.trained_parameters == trained and full.trained_parameters == PARAMETERS


def test_a_bf16_base_takes_two_bytes_a_weight():
    weights = llama_8b({"torch_dtype": "bf16"}, lora()).weights
    assert weights == 2 * PARAMETERS + 4 * 41_943_040


def test_a_4_bit_base_takes_about_half_a_byte_a_quantized_weight():
    params = {"torch_dtype": "bf16", "quantization": "nf4"}
    quantized = shape_of(CONFIG, PARAMETERS).block_linear * 32
    weights = llama_8b(params, lora()).weights - 4 * 41_943_040
    # The blocks' linear layers in 4 bits with their scales; embeddings, head and norms in bf16.
    assert weights == int(NF4_BYTES * quantized + 2 * (PARAMETERS - quantized))
    assert 0.5 * PARAMETERS < weights < 0.75 * PARAMETERS  # not 2 bytes a parameter
    int8 = llama_8b({"torch_dtype": "bf16", "quantization": "int8"}, lora()).weights
    assert weights < int8 < 1.3 * PARAMETERS


def test_a_quantized_base_dequantizes_one_weight_at_a_time():
    params = {"torch_dtype": "bf16", "precision": "bf16"}
    plain = llama_8b(params, lora())
    quantized = llama_8b(params | {"quantization": "nf4"}, lora())
    # The largest linear layer (gate/up: 4096 x 14336) dequantized to bf16.
    assert quantized.temporary - plain.temporary == 2 * 4096 * 14336


def test_the_logits_are_a_part_of_their_own():
    # vocabulary x tokens: 128,256 x 2048 in fp32 (no autocast).
    assert llama_8b({}, lora()).logits == 128_256 * 2048 * 4
    assert llama_8b({"batch_size": 2}, lora()).logits == 2 * 128_256 * 2048 * 4


def test_dropout_on_the_adapters_keeps_a_copy_of_each_adapted_input():
    no_dropout = llama_8b({}, lora(dropout=0.0)).activations
    dropout = llama_8b({}, lora(dropout=0.05)).activations
    # q, k, v, gate, up read the 4096-wide stream, o 4096 wide, down 14336: fp32 copy and mask.
    assert dropout - no_dropout == 32 * 2048 * (6 * 4096 + 14336) * (4 + 1)


def test_a_frozen_base_computes_no_weight_gradients():
    full = flops_per_sample(shape_of(CONFIG, PARAMETERS), 2048, "causal-lm")
    adapter = flops_per_sample(shape_of(CONFIG, PARAMETERS, lora()), 2048, "causal-lm")
    # 4 FLOPs a weight a token instead of 6, the attention's own unchanged.
    assert 0.66 < adapter / full < 0.72
