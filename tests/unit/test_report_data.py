import optuna
import pytest

from autotune.records import (
    BASELINE_ATTR,
    PARAMS_ATTR,
    RunInfo,
    read_snapshot,
    store_run_info,
    tell_result,
)
from autotune.report.data import build_report_data
from autotune.report.html import figures, render_html
from autotune.trial import Status, TrialResult

GIB = 1024**3
INFO = RunInfo(
    study="s", model="tiny", model_config={"model_type": "bert"}, task="sequence-classification",
    seq_len=64, device="cuda", device_name="NVIDIA H100 80GB HBM3", space="default",
    space_notes=["removed precision=fp16: because"], effective_batch_size=None,
    memory_budget_bytes=10 * GIB, headroom=0.1, noise_cv=0.1,
)  # fmt: skip
# (batch, precision, optim, outcome): outcome is (samples/s, GiB) or a Status
TRIALS = [
    (8, "fp32", "adamw_torch", (100.0, 4.0)),  # baseline
    (16, "bf16", "adamw_torch", (180.0, 3.0)),
    (32, "bf16", "adamw_torch", (250.0, 5.0)),
    (32, "fp32", "adamw_torch", (150.0, 8.0)),  # dominated by 16/bf16? no: slower than 32/bf16
    (64, "bf16", "adamw_torch", (400.0, 12.0)),  # over the 10 GiB budget
    (128, "bf16", "adamw_torch", Status.OOM),
    (256, "bf16", "adamw_torch", Status.SKIPPED),
    (16, "bf16", "sgd", (240.0, 2.5)),
    (8, "bf16", "sgd", Status.CRASHED),
]


@pytest.fixture
def data():
    study = optuna.create_study(directions=["maximize", "minimize"])
    for i, (batch, precision, optim, outcome) in enumerate(TRIALS):
        trial = study.ask()
        if isinstance(outcome, Status):
            result = TrialResult(status=outcome, reason=f"{outcome.value} reason")
        else:
            result = TrialResult(
                status=Status.OK, samples_per_s=outcome[0], peak_memory_gib=outcome[1],
                tokens_per_s=outcome[0] * 64, step_time_cv=0.02, n_params=4_386_178,
            )  # fmt: skip
        params = {"batch_size": batch, "precision": precision, "optim": optim}
        trial.set_user_attr(PARAMS_ATTR, params)
        trial.set_user_attr(BASELINE_ATTR, i == 0)
        tell_result(study, trial, result, budget_gib=10.0)
    store_run_info(study, INFO)
    return build_report_data(read_snapshot(study), code="x = 1")


def test_points_are_classed_by_outcome(data):
    kinds = {p.number: p.kind for p in data.points}
    assert kinds == {
        0: "dominated", 1: "dominated", 2: "front", 3: "dominated", 4: "over budget",
        5: "oom", 6: "skipped", 7: "front",
    }  # fmt: skip
    assert 8 not in kinds  # a crash has no place on the plot; it is in the table
    assert [p.number for p in data.points if p.baseline] == [0]
    assert [p.number for p in data.points if p.recommended] == [2]
    assert [p.number for p in data.points if p.saver] == [7]  # 240 >= 0.9 x 250, 2.5 GiB
    oom = next(p for p in data.points if p.kind == "oom")
    assert (oom.samples_per_s, oom.peak_memory_gib) == (0.0, 10.0)
    assert "batch_size = 128" in oom.hover and "oom reason" in oom.hover


def test_budget_line_and_summary(data):
    assert data.memory_budget_gib == 10.0
    assert data.memory_limit_gib == pytest.approx(9.0)
    assert data.summary["model"] == "tiny (4.4M parameters)"
    assert data.summary["trials"] == "1 crashed, 6 ok, 1 oom, 1 skipped"
    assert data.summary["recommended"].startswith("trial 2: 250.00 samples/s (2.50x the baseline)")
    assert data.summary["search time"] == "0.0 min"  # the trials above took no time
    assert data.notes == ["removed precision=fp16: because"]


def test_table_rows_keep_status_and_reason(data):
    rows = {r.number: r for r in data.rows}
    assert rows[0].status == "ok (baseline)"
    assert (rows[8].status, rows[8].reason) == ("crashed", "crashed reason")


def test_importances_for_each_objective_over_knob_names(data):
    assert set(data.importances) == {"samples_per_s", "peak_memory_gib"}
    for values in data.importances.values():
        assert set(values) <= {"batch_size", "precision", "optim"}
        assert sum(values.values()) == pytest.approx(1.0)


def test_histories_and_effect_lines(data):
    assert data.best_so_far.y == [100.0, 180.0, 250.0, 250.0, 250.0, 250.0, 250.0, 250.0, 250.0]
    assert data.hypervolume.y == sorted(data.hypervolume.y)  # never shrinks
    speed = {s.label: dict(zip(s.x, s.y, strict=True)) for s in data.speed_by_batch}
    assert speed["bf16 adamw_torch"] == {16: 180.0, 32: 250.0, 64: 400.0}
    assert speed["bf16 sgd"] == {16: 240.0}


def test_every_plot_is_drawn_into_one_page(data):
    assert [name for name, _ in figures(data)] == [
        "pareto", "parallel", "importance", "history", "hypervolume", "speed-by-batch",
        "memory-by-batch",
    ]  # fmt: skip
    page = render_html(data)
    assert page.count("* plotly.js v") == 1  # the library is embedded once for all plots
    assert 'id="pareto-plot"' in page and 'class="sortable"' in page and "x = 1" in page
