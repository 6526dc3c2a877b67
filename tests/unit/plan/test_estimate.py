import pytest

from autotune.common.models import catalogue_parameter_counts, resolve_model
from autotune.plan.estimate import (
    CPU_RUNTIME_BYTES,
    CUDA_CONTEXT_BYTES,
    Measured,
    calibrated_gib,
    estimate,
    optimizer_bytes_per_parameter,
    shape_of,
)

BERT_LARGE = resolve_model("bert-large-uncased")


PARAMETERS = catalogue_parameter_counts()["bert-large-uncased"]


GUIDE_CONTEXT_BYTES = int(1.3e9)
"""The guide's own measure of its V100's CUDA kernels ("the kernels alone take up 1.3GB")."""


# The guide (V100, seq 512, BertForSequenceClassification, 2021 PyTorch: eager attention, and
# gradients zeroed in place, so they live through each forward): knobs -> GB.
GUIDE = [
    ({"batch_size": 4}, 14.9),
    ({"batch_size": 4, "precision": "fp16"}, 13.9),
    ({"batch_size": 1, "grad_accum": 4}, 8.7),
]


def guide_estimate_gb(knobs: dict) -> float:
    params = {"optim": "adamw_torch", "attn_implementation": "eager"} | knobs
    found = estimate(
        BERT_LARGE.config,
        task="sequence-classification",
        seq_len=512,
        params=params,
        device="cuda",
        parameters=PARAMETERS,
        context_bytes=GUIDE_CONTEXT_BYTES,
        gradients_kept=True,
    )
    return found.total / 1e9


@pytest.mark.parametrize(("knobs", "guide_gb"), GUIDE)
def test_the_estimate_is_within_15_percent_of_the_guides_measurements(knobs, guide_gb):
    assert guide_estimate_gb(knobs) == pytest.approx(guide_gb, rel=0.15)


def test_the_parts_follow_the_guides_anatomy():
    p = PARAMETERS
    fp32 = estimate(
        BERT_LARGE.config,
        task="sequence-classification",
        seq_len=512,
        params={"batch_size": 4},
        device="cpu",
        parameters=p,
    )
    assert (fp32.weights, fp32.gradients, fp32.optimizer) == (4 * p, 4 * p, 8 * p)
    assert fp32.context == CPU_RUNTIME_BYTES, "the CPU runtime's own memory, no CUDA context"
    on_cuda = estimate(
        BERT_LARGE.config,
        task="sequence-classification",
        seq_len=512,
        params={"batch_size": 4},
        device="cuda",
        parameters=p,
    )
    assert on_cuda.context == CUDA_CONTEXT_BYTES
    # CPU SDPA under autocast runs the math path in fp32: more than eager attention keeps.
    cpu_mixed = {"batch_size": 4, "precision": "bf16"}
    sdpa, eager = (
        estimate(
            BERT_LARGE.config,
            task="sequence-classification",
            seq_len=512,
            params={**cpu_mixed, "attn_implementation": attention},
            device="cpu",
            parameters=p,
        )
        for attention in ("sdpa", "eager")
    )
    assert sdpa.activations > eager.activations
    assert eager.weights == 6 * p and eager.activations < fp32.activations
    assert optimizer_bytes_per_parameter("adamw_bnb_8bit") == 2
    assert optimizer_bytes_per_parameter("sgd") == 0
    adafactor = estimate(
        BERT_LARGE.config,
        task="sequence-classification",
        seq_len=512,
        params={"optim": "adafactor"},
        device="cpu",
        parameters=p,
    )
    assert adafactor.optimizer < 0.1 * p, "factored second moments: a row and a column"
    checkpointed = estimate(
        BERT_LARGE.config,
        task="sequence-classification",
        seq_len=512,
        params={"batch_size": 4, "gradient_checkpointing": True},
        device="cpu",
        parameters=p,
    )
    assert checkpointed.activations < fp32.activations / 10


def test_activations_grow_linearly_with_the_batch():
    def activations(batch: int) -> int:
        return estimate(
            BERT_LARGE.config,
            task="masked-lm",
            seq_len=128,
            params={"batch_size": batch},
            device="cuda",
        ).activations

    assert activations(16) == 2 * activations(8) == 4 * activations(4)


def test_the_shape_is_read_from_bert_gpt2_and_t5_configs():
    for name in ("bert-large-uncased", "gpt2", "t5-small"):
        shape = shape_of(resolve_model(name).config)
        counted = catalogue_parameter_counts()[name]
        assert shape.parameters == pytest.approx(counted, rel=0.05), name


def measured(batch: int, estimate_gib: float, peak_gib: float, **knobs) -> Measured:
    return Measured(
        params={"batch_size": batch, **knobs}, estimate_gib=estimate_gib, peak_gib=peak_gib
    )


def test_calibration_uses_the_closest_evidence_there_is():
    params = {"batch_size": 32}
    assert calibrated_gib(params, 4.0, []) == 4.0, "nothing measured: the estimate itself"
    one = [measured(8, 1.0, 1.5)]
    assert calibrated_gib(params, 4.0, one) == pytest.approx(4.5), "shifted like its mode"
    line = [measured(8, 1.0, 1.5), measured(16, 2.0, 2.5)]  # 0.5 + 0.125 GiB a sample
    assert calibrated_gib(params, 4.0, line) == pytest.approx(4.5), "the mode's straight line"
    other_mode = [measured(8, 1.0, 2.0, precision="bf16")]
    assert calibrated_gib(params, 4.0, other_mode) == pytest.approx(5.0), "the study's shift"


def test_partial_checkpointing_keeps_the_activations_of_the_blocks_it_skips():
    def activations(**knobs) -> int:
        return estimate(
            BERT_LARGE.config,
            task="masked-lm",
            seq_len=256,
            device="cuda",
            params={"batch_size": 8, **knobs},
        ).activations

    none, full = activations(), activations(gradient_checkpointing=True)
    half = activations(gradient_checkpointing=True, checkpointing_every_n_layers=2)
    assert full < half < none
    # 24 blocks, every second checkpointed: 12 keep their activations, 12 their input.
    assert half - full == pytest.approx((none - full) / 2, rel=0.05)
    assert activations(gradient_checkpointing=True, checkpointing_every_n_layers=1) == full
