"""The skip by estimate with an H100 80GB's own probe facts
(../shared/gpu/h100-2026-11-26/probe.json): 79.18 GiB on the card, 78.66 free, the budget."""

import json
from pathlib import Path

import pytest

from autotune.common.device import DeviceInfo
from autotune.common.trial import Status, TrialResult
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.store.records import TrialRecord
from autotune.study.checks import first_skip, for_plan

H100 = DeviceInfo.from_facts(
    json.loads((Path(__file__).parents[2] / "fixtures" / "probe-h100-2026-11-26.json").read_text())
)
CARD_GIB = H100.total_memory_bytes / 2**30


def h100_plan(tmp_path, *settings: str):
    config = load_config(["model=bert-large-uncased", "seq_len=512", f"out={tmp_path}", *settings])
    return make_plan(config, H100)


def test_the_skip_threshold_is_never_above_the_cards_memory(tmp_path):
    plan = h100_plan(tmp_path)
    assert plan.info.memory_budget_gib == pytest.approx(78.66, abs=0.01)
    # budget x 1.25 would be 98.3 GiB: past the card, the margin only buys an OOM.
    assert plan.estimate_limit_gib == pytest.approx(79.18 - 0.75, abs=0.01)
    assert plan.estimate_limit_gib < CARD_GIB
    assert plan.estimate_limit_source == (
        "the GPU can give a trial's allocator (its 79.18 GiB less a CUDA context of 0.75 GiB)"
    )
    assert h100_plan(tmp_path, "memory_budget=200GiB").estimate_limit_gib < CARD_GIB
    smaller = h100_plan(tmp_path, "memory_budget=24GiB")  # tuning for a 24 GB card: margin kept
    assert smaller.estimate_limit_gib == pytest.approx(30)
    assert smaller.estimate_limit_source == "memory_budget and estimate_margin allow"


def test_the_compiled_setting_that_oomed_on_the_h100_is_skipped_naming_the_card(tmp_path):
    """The search's trial 2 ran (estimate 61.0 GiB) and ran out of memory past 78.66 GiB; its
    trial 0, the baseline, had measured 10.30 GiB."""
    plan = h100_plan(tmp_path)
    baseline = TrialRecord(
        number=0,
        params=plan.baseline,
        result=TrialResult(
            status=Status.OK, peak_memory_gib=10.2988, estimate_gib=plan.estimate_gib(plan.baseline)
        ),
    )
    oomed = {
        "batch_size": 72,
        "grad_accum": 4,
        "gradient_checkpointing": False,
        "use_liger_kernel": False,
        "precision": "tf32",
        "optim": "adafactor",
        "torch_compile": "inductor",
        "compile_mode": "default",
        "attn_implementation": "sdpa",
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": True,
    }
    skip = first_skip(oomed, [baseline], for_plan(plan), plan.estimate_gib(oomed))
    assert skip is not None and skip.repeat_of is None
    assert skip.reason.endswith(
        "GiB (calibrated on 1 trial(s)), over the 78.43 GiB the GPU can give a trial's "
        "allocator (its 79.18 GiB less a CUDA context of 0.75 GiB)"
    )
    # The same setting eager, at a batch the card holds, still runs.
    fitting = oomed | {"torch_compile": "off", "batch_size": 32}
    assert first_skip(fitting, [baseline], for_plan(plan), plan.estimate_gib(fitting)) is None
