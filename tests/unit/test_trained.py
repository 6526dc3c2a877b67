"""A study of the user's own Trainer (`trainer=`) says what the factory really trains, and
makes no memory estimate of a model it may not train."""

from __future__ import annotations

from autotune.common.device import DeviceInfo
from autotune.common.trial import Status, TrialResult
from autotune.outputs.snapshot import trained_note
from autotune.plan.config import load_config
from autotune.plan.plan import make_plan
from autotune.store.records import TrialRecord
from tests.conftest import TINY_MODEL

CPU = DeviceInfo(
    cuda_available=False, name="cpu", total_memory_bytes=2**34, free_memory_bytes=2**34,
    cpu_name="cpu", host_available_memory_bytes=2**34,
)  # fmt: skip


def trained(model: str | None, seq_len: int | None, status: Status = Status.OK) -> TrialRecord:
    result = TrialResult(status=status, samples_per_s=10.0, peak_memory_gib=1.0,
                         trained_model=model, trained_seq_len=seq_len)  # fmt: skip
    return TrialRecord(number=0, params={}, result=result, baseline=True)


def test_what_the_factory_trains_is_said_when_it_is_not_what_the_study_is_named_for(tmp_path):
    factory = tmp_path / "f.py"
    factory.write_text("def make(args, model_kwargs):\n    pass\n")
    settings = [f"model={TINY_MODEL}", "seq_len=128", f"out={tmp_path}", f"trainer={factory}:make"]
    plan = make_plan(load_config(settings), CPU)
    assert plan.estimate_gib(plan.baseline) is None  # no estimate of a model it may not train
    info = plan.info
    assert trained_note(info, [trained("bert", 128)]) is None  # the config's model_type
    assert trained_note(info, [trained(TINY_MODEL, 128)]) is None
    assert trained_note(info, [trained("bert", 57)]) == (
        f"the factory trains bert on batches of up to 57 tokens, not model={TINY_MODEL} at "
        "seq_len=128: those name the study only, and no memory estimate is made for a "
        "factory's model"
    )
    assert "trains gpt2 on" in trained_note(info, [trained("gpt2", 128)])
    assert trained_note(info, [trained("gpt2", 64, Status.OOM)]) is None  # nothing trained
    ours = make_plan(load_config(settings[:3]), CPU)
    assert ours.estimate_gib(ours.baseline) is not None
