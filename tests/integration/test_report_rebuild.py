"""A report rebuilt in another process is the same, byte for byte."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna

from autotune.common.trial import Status, TrialResult
from autotune.plan.run_info import RunInfo
from autotune.store.records import BASELINE_ATTR, PARAMS_ATTR, store_run_info, tell_result

INFO = RunInfo(
    study="s",
    model="tiny",
    model_config={"model_type": "bert"},
    task="sequence-classification",
    seq_len=64,
    device="cuda",
    device_name="NVIDIA H100 80GB HBM3",
    space="default",
    space_notes=[],
    effective_batch_size=None,
    memory_budget_bytes=10 * 1024**3,
    headroom=0.1,
    noise_cv=0.1,
)

IMPORTANCES_IN_A_FRESH_PROCESS = """
import json
from autotune.store.records import TrialRecord
from autotune.outputs.report.charts import importances
from autotune.common.trial import Status, TrialResult
# 'zeta' and 'alpha' always move together: their importances tie (but for the last bits).
outcomes = [(8, 100.0, 4.0), (16, 180.0, 3.0), (32, 250.0, 5.0), (16, 150.0, 8.0),
            (8, 120.0, 2.0), (32, 260.0, 6.0)]
records = [
    TrialRecord(number=i, params={"zeta": b, "alpha": b * 2, "precision": ("fp32", "bf16")[i % 2]},
                result=TrialResult(status=Status.OK, samples_per_s=s, peak_memory_gib=m))
    for i, (b, s, m) in enumerate(outcomes)
]
print(json.dumps({k: list(v) for k, v in importances(records).items()}))
"""


def test_importance_order_is_the_same_in_every_process():
    """A report rebuilt from storage must be byte-identical, whatever the hash seed."""
    orders = set()
    for seed in range(4):
        out = subprocess.run(
            [sys.executable, "-c", IMPORTANCES_IN_A_FRESH_PROCESS],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        )
        orders.add(out.stdout.strip().splitlines()[-1])
    assert len(orders) == 1, orders
    ranked = json.loads(orders.pop())["samples_per_s"]
    assert ranked.index("alpha") == ranked.index("zeta") - 1  # a tie, broken by name


def write_study(study_dir: Path) -> None:
    """A study of four trials (a noisy one, an OOM, one over the budget) in STUDY_DIR/study.db."""
    study_dir.mkdir()
    study = optuna.create_study(
        study_name="s",
        storage=f"sqlite:///{study_dir / 'study.db'}",
        directions=["maximize", "minimize"],
    )
    store_run_info(study, INFO)
    for i, (batch, gc, outcome) in enumerate(
        [
            (8, False, (100.0, 4.0, 0.02)),
            (16, False, (180.0, 5.0, 0.3)),
            (32, True, (150.0, 3.0, 0.02)),
            (64, False, Status.OOM),
            (32, False, (200.0, 12.0, 0.02)),
        ]
    ):
        trial = study.ask()
        trial.set_user_attr(
            PARAMS_ATTR,
            {
                "batch_size": batch,
                "gradient_checkpointing": gc,
                "precision": "bf16" if i else "fp32",
            },
        )
        trial.set_user_attr(BASELINE_ATTR, i == 0)
        if isinstance(outcome, Status):
            result = TrialResult(status=outcome, reason="out of memory", peak_memory_gib=11.0)
        else:
            speed, memory, cv = outcome
            result = TrialResult(
                status=Status.OK,
                samples_per_s=speed,
                tokens_per_s=speed * 64,
                peak_memory_gib=memory,
                step_time_cv=cv,
            )
        tell_result(study, trial, result, budget_gib=10.0, noise_cv=0.1)


def test_a_report_rebuilt_in_another_process_is_identical(tmp_path):
    """`autotune report` twice, under other hash seeds: the same report.html, byte for byte."""
    study_dir = tmp_path / "s"
    write_study(study_dir)
    pages = []
    for seed in ("0", "1"):
        subprocess.run(
            [sys.executable, "-m", "autotune", "report", str(study_dir)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        pages.append((study_dir / "report.html").read_bytes())
        time.sleep(1.1)  # a timestamp anywhere in the page would differ
    assert pages[0] == pages[1]
    assert b'id="plotly-js"' in pages[0] and b"changes vs baseline" in pages[0]
