"""The Trainer a trial times: its arguments as the installed transformers takes them."""

from autotune.child import trainers
from autotune.common import knobs
from autotune.common.trial import TrialSpec


def cuda_spec(**params) -> TrialSpec:
    return TrialSpec(
        trial_number=0,
        model_name="m",
        model_config={},
        task="masked-lm",
        seq_len=512,
        device="cuda",
        params=params,
        warmup_steps=1,
        measure_steps=2,
        seed=0,
    )


def test_on_cuda_tf32_is_passed_off_so_that_compile_cannot_turn_it_on(tmp_path):
    # transformers turns TF32 on under torch_compile when `tf32` is None: every fp32 trial
    # under inductor ran TF32 while it was recorded and recommended as fp32.
    spec = cuda_spec(precision="fp32", torch_compile="inductor")
    tuned = knobs.training_args(spec.params, device="cuda", fields=trainers.ARG_FIELDS)
    args = trainers.training_arguments(spec, tuned, str(tmp_path))  # as the trial makes them
    assert args.tf32 is False and args.torch_compile is True
    assert tuned["tf32"] is False  # what the trial records and the export writes
    for precision in ("bf16", "fp16", "fp8"):  # (this CPU refuses 16-bit TrainingArguments)
        params = {"precision": precision, "torch_compile": "inductor"}
        assert (
            knobs.training_args(params, device="cuda", fields=trainers.ARG_FIELDS)["tf32"] is False
        )


def test_on_cuda_a_tf32_precision_asks_for_tf32():
    for precision in ("tf32", "bf16+tf32", "fp16+tf32"):
        tuned = knobs.training_args(
            {"precision": precision}, device="cuda", fields=trainers.ARG_FIELDS
        )
        assert tuned["tf32"] is True, precision
