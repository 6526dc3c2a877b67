"""A settled plan keeps only the batch sizes its budget can hold."""

from __future__ import annotations

from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.plan.settle import fit_batches_to_budget
from tests.unit.stand_ins import CPU


def test_batch_sizes_that_cannot_fit_leave_the_space_and_the_smallest_stays(tmp_path):
    def plan_for(tmp_path, *settings):
        return make_plan(load_config([f"out={tmp_path}", *settings]), CPU)

    settings = ["model=bert-large-uncased", "seq_len=512", "space=memory"]
    roomy = plan_for(tmp_path, *settings, "memory_budget=80GiB")
    assert fit_batches_to_budget(roomy) == roomy
    tight = plan_for(tmp_path, *settings, "memory_budget=3GiB")
    trimmed = fit_batches_to_budget(tight)
    before, after = (p.space.knobs["batch_size"].choices for p in (tight, trimmed))
    assert 1 < len(after) < len(before) and after == before[: len(after)]
    limit = 3 * 1.25
    frugal = {
        "precision": "bf16",
        "optim": "adafactor",
        "gradient_checkpointing": True,
        "grad_accum": 4,
    }
    assert trimmed.estimate_gib({**frugal, "batch_size": after[-1]}) <= limit
    assert tight.estimate_gib({**frugal, "batch_size": before[len(after)]}) > limit
    assert "batch_size above" in trimmed.info.space_notes[-1]
    # Nothing fits: the smallest batch stays, and its trials say why.
    assert (
        fit_batches_to_budget(plan_for(tmp_path, *settings, "memory_budget=1GiB"))
        .space.knobs["batch_size"]
        .choices
        == before[:1]
    )
    off = plan_for(tmp_path, *settings, "memory_budget=3GiB", "estimate_margin=null")
    assert fit_batches_to_budget(off) == off


def test_a_simulated_study_and_a_measured_one_never_mix(tmp_path):
    import dataclasses

    import pytest

    from autotune.common.errors import StudyError
    from autotune.plan.settle import settle
    from tests.unit.stand_ins import GPUS

    one = dataclasses.replace(GPUS, cuda_device_names=GPUS.cuda_device_names[:1], gpu_links=())
    settings = [f"out={tmp_path}", "model=gpt2", "study=s"]
    measured = make_plan(load_config(settings), one)
    twin = make_plan(load_config([*settings, "executor=twin", "gpu=H100"]), one)
    assert measured.info.simulated is None
    assert twin.info.simulated == f"the GPU twin of 1x {one.name}"
    assert settle(twin, twin.info).info.simulated == twin.info.simulated  # a resume
    with pytest.raises(StudyError, match="holds measured trials, and this run is simulated by"):
        settle(twin, measured.info)
    with pytest.raises(StudyError, match="Resume it with executor=twin and its gpu="):
        settle(measured, twin.info)
    other = dataclasses.replace(twin.info, simulated="the GPU twin of 1x NVIDIA L4")
    with pytest.raises(StudyError, match="Resume it with the same gpu= and gpu_count="):
        settle(twin, other)
