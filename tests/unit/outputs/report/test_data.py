import base64
import dataclasses
import gzip
import html
import re

import optuna
import pytest
from optuna.trial import TrialState

from autotune.common.trial import Status, TrialResult
from autotune.outputs.report.data import CHARTS, build_report_data
from autotune.outputs.report.figures import figures
from autotune.outputs.report.html import packed_plotly_js, render_html
from autotune.outputs.snapshot import read_snapshot
from autotune.plan.run_info import RunInfo
from autotune.store.records import BASELINE_ATTR, PARAMS_ATTR, store_run_info, tell_result

GIB = 1024**3


INFO = RunInfo(
    study="s",
    model="tiny",
    model_config={"model_type": "bert"},
    task="sequence-classification",
    seq_len=64,
    device="cuda",
    device_name="NVIDIA H100 80GB HBM3",
    space="default",
    space_notes=["removed precision=fp16: because"],
    effective_batch_size=None,
    memory_budget_bytes=10 * GIB,
    headroom=0.1,
    noise_cv=0.1,
)


INTERRUPTED = "interrupted"
"""An outcome: the trial stopped with its search and left no result."""


# (batch, precision, optim, outcome): outcome is (samples/s, GiB), (samples/s, GiB, step CV),
# a Status or a TrialResult
TRIALS = [
    (8, "fp32", "adamw_torch", (100.0, 4.0)),  # baseline
    (16, "bf16", "adamw_torch", (180.0, 3.0)),
    (32, "bf16", "adamw_torch", (250.0, 5.0, 0.25)),  # recommended, and noisy
    (32, "fp32", "adamw_torch", (150.0, 8.0)),  # dominated by 16/bf16? no: slower than 32/bf16
    (64, "bf16", "adamw_torch", (400.0, 12.0)),  # over the 10 GiB budget
    (128, "bf16", "adamw_torch", Status.OOM),  # stopped at 12.5 GiB, drawn at the budget
    (256, "bf16", "adamw_torch", Status.SKIPPED),
    (16, "bf16", "sgd", (240.0, 2.5)),
    (8, "bf16", "sgd", Status.CRASHED),
]


def build(trials, info=INFO):
    """Report data for trials given as (params, outcome); the first is the baseline."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    for i, (params, outcome) in enumerate(trials):
        trial = study.ask()
        if outcome == INTERRUPTED:
            study.tell(trial, state=TrialState.FAIL)
            continue
        if isinstance(outcome, TrialResult):
            result = outcome
        elif isinstance(outcome, Status):
            peak = 12.5 if outcome is Status.OOM else None
            result = TrialResult(
                status=outcome, reason=f"{outcome.value} reason", peak_memory_gib=peak
            )
        else:
            speed, memory, cv = (*outcome, 0.02)[:3]
            result = TrialResult(
                status=Status.OK,
                samples_per_s=speed,
                peak_memory_gib=memory,
                tokens_per_s=speed * 64,
                step_time_cv=cv,
                n_params=4_386_178,
            )
        trial.set_user_attr(PARAMS_ATTR, params)
        trial.set_user_attr(BASELINE_ATTR, i == 0)
        tell_result(study, trial, result, budget_gib=info.memory_budget_gib, noise_cv=0.1)
    store_run_info(study, info)
    return build_report_data(read_snapshot(study), code="x = 1", cli_flags="--bf16")


def every_outcome():
    """Report data for TRIALS: a trial of every outcome."""
    return build(
        [({"batch_size": b, "precision": p, "optim": o}, outcome) for b, p, o, outcome in TRIALS]
    )


@pytest.fixture(scope="module")
def data():
    return every_outcome()


def test_points_are_classed_by_outcome(data):
    kinds = {p.number: p.kind for p in data.points}
    assert kinds == {
        0: "dominated",
        1: "dominated",
        2: "front",
        3: "dominated",
        4: "over budget",
        5: "oom",
        6: "skipped",
        7: "front",
    }
    assert 8 not in kinds  # a crash has no place on the plot; it is in the table
    assert [p.number for p in data.points if p.baseline] == [0]
    assert [p.number for p in data.points if p.recommended] == [2]
    assert [p.number for p in data.points if p.saver] == [7]  # 240 >= 0.9 x 250, 2.5 GiB
    assert "batch_size = 128" in data.points[5].hover and "oom reason" in data.points[5].hover


def test_out_of_memory_trials_sit_at_the_budget_whatever_they_read_when_stopped(data):
    for number in (5, 6):  # oom at 12.5 GiB; skipped with no reading at all
        point = data.points[number]
        assert (point.samples_per_s, point.peak_memory_gib) == (0.0, 10.0)
    assert "peak 12.500 GiB when stopped (drawn at the budget)" in data.points[5].hover


def test_budget_line_and_summary(data):
    assert data.memory_budget_gib == 10.0
    assert data.memory_limit_gib == pytest.approx(9.0)
    assert data.summary["model"] == "tiny (4.4M parameters)"
    assert data.summary["trials"] == "1 crashed, 6 ok, 1 oom, 1 skipped"
    assert data.summary["recommended"].startswith("trial 2: 250.00 samples/s (2.50x the baseline")
    assert data.summary["search time"] == "0.0 min"  # the trials above took no time
    assert data.notes == ["removed precision=fp16: because"]


def test_the_device_row_names_the_link_between_a_trials_gpus_where_it_is_known(data):
    assert data.summary["device"] == "cuda (NVIDIA H100 80GB HBM3)"
    link = "NVLink 4 x18 through an NVSwitch, 450 GB/s a direction"
    two_gpus = dataclasses.replace(INFO, devices_per_trial=2, gpu_link=link)
    first = [({"batch_size": 8, "precision": "fp32", "optim": "adamw_torch"}, (100.0, 4.0))]
    summary = build(first, info=two_gpus).summary
    assert summary["device"] == f"cuda (NVIDIA H100 80GB HBM3); between a trial's GPUs: {link}"


def test_noisy_trials_are_flagged_in_table_hover_front_and_summary(data):
    assert [r.number for r in data.rows if r.noisy] == [2]
    assert [p.number for p in data.points if p.noisy] == [2]
    assert "noisy: step CV 25% (above noise_cv 10%)" in data.points[2].hover
    assert "noisy" not in data.points[1].hover
    # The speedup of a noisy recommendation carries the caveat, with what to do about it.
    assert "noisy: step CV 25% on it" in data.summary["recommended"]
    assert "more measure_steps or an idle machine" in data.summary["recommended"]
    assert "noisy" not in data.summary["baseline (HF defaults)"]
    page = render_html(data)
    assert '<td class="noisy">25.0% noisy</td>' in page
    pareto = dict(figures(data))["pareto"]
    ring = next(t for t in pareto.data if t.name.startswith("noisy"))
    assert list(ring.x) == [5.0]  # around trial 2, at its 5 GiB


def test_a_noisy_baseline_is_said_next_to_it_and_next_to_every_speedup():
    trials = [
        ({"batch_size": 8, "precision": "fp32"}, (100.0, 4.0, 0.3)),
        ({"batch_size": 16, "precision": "fp32"}, (150.0, 5.0)),
    ]
    data = build(trials)
    baseline = data.summary["baseline (HF defaults)"]
    assert baseline.endswith(
        "; noisy: step CV 30% on it (above noise_cv 10%); more measure_steps "
        "or an idle machine would firm the figure up"
    )
    assert "noisy: step CV 30% on the baseline" in data.summary["recommended"]


def test_changes_to_the_training_are_listed_under_the_picks_in_the_table_and_hover(data):
    # Trial 2 (recommended): bs 32 vs 8 and bf16 vs fp32; trial 7 (saver) also another optimizer.
    recommended = data.summary["recommended: changes the training"].splitlines()
    assert [line.split(":")[0] for line in recommended] == [
        "effective_batch_size 8 -> 32",
        "precision fp32 -> bf16",
    ]
    saver = data.summary["memory saver: changes the training"]
    assert "optim adamw_torch -> sgd: another optimizer (SGD, not AdamW)" in saver
    rows = {r.number: r for r in data.rows}
    assert [c.setting for c in rows[0].changes] == []  # the baseline itself
    assert [c.setting for c in rows[3].changes] == ["effective_batch_size"]  # fp32, bs 32
    assert "changes the training: precision fp32 -> bf16" in data.points[2].hover
    page = render_html(data)
    # The column names the settings; its title says what each change does.
    cell = re.search(r'<td class="changes" title="([^"]*)">effective_batch_size, precision<', page)
    assert cell and "precision fp32 -&gt; bf16: 16-bit mixed precision" in cell.group(1)


def test_a_recommendation_that_is_the_memory_saver_says_so():
    trials = [
        ({"batch_size": 8, "precision": "fp32"}, (100.0, 4.0)),
        ({"batch_size": 8, "precision": "bf16"}, (150.0, 3.0)),
    ]
    data = build(trials)
    assert data.summary["memory saver"].startswith("the same trial")
    assert "memory saver: changes the training" not in data.summary
    assert data.summary["recommended: changes the training"].startswith("precision fp32 -> bf16")


def test_table_rows_keep_status_and_reason(data):
    rows = {r.number: r for r in data.rows}
    assert rows[0].status == "ok (baseline)"
    assert (rows[8].status, rows[8].reason) == ("crashed", "crashed reason")


def test_importances_for_each_objective_over_knob_names_with_how_many_trials(data):
    assert set(data.importances) == {"samples_per_s", "peak_memory_gib"}
    for values in data.importances.values():
        assert set(values) <= {"batch_size", "precision", "optim"}
        assert sum(values.values()) == pytest.approx(1.0)
    # Trials 0, 1, 2, 3 and 7 succeeded within the budget: the best 10% is one trial.
    assert data.importance_note.startswith("Rests on 5 successful trials within the budget.")
    assert "(1 here)" in data.importance_note and "read this as a hint" in data.importance_note
    assert data.importance_note in render_html(data)


def test_histories_are_at_the_trial_numbers_the_table_uses(data):
    numbers = [float(r.number) for r in data.rows]
    assert data.best_so_far.x == data.hypervolume.x == numbers == [float(n) for n in range(9)]
    assert data.best_so_far.y == [100.0, 180.0, 250.0, 250.0, 250.0, 250.0, 250.0, 250.0, 250.0]
    assert data.hypervolume.y == sorted(data.hypervolume.y)  # never shrinks
    # An interrupted trial is a row (its status says so) and adds nothing to the histories.
    gap = build(
        [({"batch_size": 8}, (100.0, 4.0)), ({}, INTERRUPTED), ({"batch_size": 16}, (150.0, 5.0))]
    )
    assert [(r.number, r.status) for r in gap.rows] == [
        (0, "ok (baseline)"),
        (1, "interrupted"),
        (2, "ok"),
    ]
    assert gap.best_so_far.x == [0.0, 1.0, 2.0] and gap.best_so_far.y == [100.0, 100.0, 150.0]
    assert [p.number for p in gap.points] == [0, 2]


def lines_of(series):
    return {s.label: dict(zip(s.x, s.y, strict=True)) for s in series if s.lines}


def test_batch_lines_join_only_trials_that_differ_in_batch_size_alone(data):
    speed = lines_of(data.speed_by_batch)
    assert speed == {
        "fp32 adamw_torch": {8: 100.0, 32: 150.0},
        "bf16 adamw_torch": {16: 180.0, 32: 250.0, 64: 400.0},
    }
    (alone,) = [s for s in data.speed_by_batch if not s.lines]
    assert (alone.x, alone.y) == ([16], [240.0])  # the only successful sgd trial
    assert alone.hover == [
        "trial 7: 240.00 samples/s (bar ±4.80: 1 step-time CV, 2.0%)<br>bs=16 bf16 sgd"
    ]
    # Checkpointing on at batch 32 only: no line from batch 16 (off) to 32 (on).
    trials = [
        ({"batch_size": 8, "gradient_checkpointing": False}, (100.0, 4.0)),
        ({"batch_size": 16, "gradient_checkpointing": False}, (150.0, 5.0)),
        ({"batch_size": 32, "gradient_checkpointing": True}, (120.0, 3.0)),
    ]
    memory = build(trials).memory_by_batch
    assert lines_of(memory) == {"gc=off": {8: 4.0, 16: 5.0}}
    assert [(s.x, s.lines) for s in memory if not s.lines] == [([32], False)]


def test_with_a_fixed_effective_batch_grad_accum_moves_with_the_batch_size():
    trials = [
        ({"batch_size": 8, "grad_accum": 4, "precision": "bf16"}, (100.0, 4.0)),
        ({"batch_size": 16, "grad_accum": 2, "precision": "bf16"}, (150.0, 5.0)),
        ({"batch_size": 32, "grad_accum": 1, "precision": "bf16"}, (170.0, 7.0)),
    ]
    fixed = build(trials, dataclasses.replace(INFO, effective_batch_size=32))
    assert lines_of(fixed.speed_by_batch) == {"bf16": {8: 100.0, 16: 150.0, 32: 170.0}}
    free = build(trials)  # grad_accum sampled: each differs in more than the batch size
    assert lines_of(free.speed_by_batch) == {}


def test_parallel_coordinates_put_each_knob_value_on_a_tick_of_its_own():
    trials = [
        ({"batch_size": 8, "grad_accum": 1, "gradient_checkpointing": False}, (100.0, 4.0)),
        ({"batch_size": 16, "grad_accum": 2, "gradient_checkpointing": True}, (150.0, 5.0)),
        ({"batch_size": 64, "grad_accum": 4, "gradient_checkpointing": False}, (170.0, 7.0)),
        ({"batch_size": 16, "grad_accum": 1, "gradient_checkpointing": True}, (160.0, 3.0)),
    ]
    axes = {a.name: a for a in build(trials).parallel}
    assert list(axes) == [
        "batch_size",
        "grad_accum",
        "gradient_checkpointing",
        "peak_memory_gib",
        "samples_per_s",
    ]
    assert axes["batch_size"].ticktext == ["8", "16", "64"]  # in value order, not as text
    assert axes["batch_size"].values == [0, 1, 2, 1]
    assert axes["grad_accum"].ticktext == ["1", "2", "4"]  # no tick at 1.2 or 1.8
    assert axes["gradient_checkpointing"].ticktext == ["off", "on"]
    assert axes["samples_per_s"].ticktext == [] and axes["samples_per_s"].values[0] == 100.0
    dimensions = dict(figures(build(trials)))["parallel"].data[0].dimensions
    assert list(dimensions[1].tickvals) == [0, 1, 2] and dimensions[4].tickvals is None


def test_with_every_trial_out_of_memory_each_chart_says_why_it_is_empty():
    trials = [({"batch_size": b}, Status.OOM) for b in (8, 16)] + [
        ({"batch_size": 32}, Status.SKIPPED)
    ]
    data = build(trials)
    assert data.summary["recommended"].startswith("nothing to recommend")
    assert list(data.empty) == list(CHARTS)
    assert "No trial measured a throughput (2 oom, 1 skipped)" in data.empty["pareto"]
    assert "0 such trials" in data.empty["importance"]
    assert figures(data) == []
    page = render_html(data)
    for sentence in data.empty.values():
        assert sentence in page
    assert 'id="plotly-js"' not in page  # nothing to draw: no 2 MB library either
    assert "nothing to recommend" in page


def test_every_plot_is_drawn_into_one_page_with_plotly_js_once_and_packed(data):
    assert (
        [name for name, _ in figures(data)]
        == list(CHARTS)
        == [
            "pareto",
            "parallel",
            "importance",
            "history",
            "hypervolume",
            "speed-by-batch",
            "memory-by-batch",
        ]
    )
    assert data.empty == {}
    page = render_html(data)
    packed = re.findall(r'<script type="text/plain" id="plotly-js">([^<]*)</script>', page)
    assert len(packed) == 1  # the library is embedded once for all plots
    assert b"plotly.js v" in gzip.decompress(base64.b64decode(packed[0]))[:1000]
    assert len(page) < 2_500_000  # the plain bundle alone is 4.8 MB
    assert page.count('class="figure"') == len(CHARTS)
    assert 'id="pareto-plot"' in page and 'class="sortable"' in page and "x = 1" in page
    assert '<pre class="wrap"><code>--bf16</code></pre>' in page  # long flags wrap, not clip


def test_the_packed_library_carries_no_timestamp_so_a_rebuilt_page_is_identical():
    packed = base64.b64decode(packed_plotly_js())
    assert packed[:2] == b"\x1f\x8b" and packed[4:8] == b"\0\0\0\0"  # gzip, mtime 0


def test_each_trial_carries_its_step_time_spread_as_error_bars_on_the_throughput_charts(data):
    points = {p.number: p for p in data.points}
    # Trial 2: 250 samples/s with a step-time CV of 25%: +- 62.5 samples/s.
    assert points[2].samples_per_s_spread == pytest.approx(62.5)
    assert points[1].samples_per_s_spread == pytest.approx(180.0 * 0.02)
    assert points[5].samples_per_s_spread is None  # out of memory: no steps were timed
    assert "250.00 samples/s (bar ±62.50: 1 step-time CV, 25.0%)" in points[2].hover
    speed = {s.label: dict(zip(s.x, s.spread, strict=True)) for s in data.speed_by_batch}
    assert speed["bf16 adamw_torch"][32] == pytest.approx(62.5)
    assert all(s.spread == [] for s in data.memory_by_batch)  # one peak reading: no spread
    drawn = dict(figures(data))
    front = next(t for t in drawn["pareto"].data if t.name == "front")
    by_number = dict(zip(front.x, front.error_y.array, strict=True))
    assert by_number[5.0] == pytest.approx(62.5)  # trial 2 peaked at 5 GiB
    assert all(t.error_y.array is None for t in drawn["pareto"].data if t.name == "oom")
    assert all(t.error_y.array for t in drawn["speed-by-batch"].data)
    assert not any(t.error_y.array for t in drawn["memory-by-batch"].data)


def test_long_reasons_wrap_in_the_hover_and_the_table():
    path = "/home/someone/" + "a-very-long-folder-name/" * 8 + "model.safetensors"
    reason = f"OSError: <class 'OSError'> could not read {path} while loading the weights " * 2
    trials = [
        ({"batch_size": 8}, (100.0, 4.0)),
        ({"batch_size": 16}, TrialResult(status=Status.OOM, reason=reason, peak_memory_gib=9.0)),
    ]
    data = build(trials)
    hover = next(p for p in data.points if p.number == 1).hover.split("<br>")
    assert max(len(html.unescape(line)) for line in hover) <= 80  # as plotly shows them
    assert hover[1].startswith("peak 9.000 GiB")
    settings = hover.index("batch_size = 16")
    wrapped = hover[2:settings]  # the reason, between the peak and the settings
    shown = [html.unescape(line) for line in wrapped]
    assert len(shown) > 3
    assert "&lt;class 'OSError'&gt;" in wrapped[0]  # plotly would read <class ...> as a tag
    assert "".join(shown).replace(" ", "") == reason.replace(" ", "")  # nothing lost
    assert '<td class="reason">OSError: &lt;class' in render_html(data)  # wraps by its CSS


def test_the_model_row_says_whose_parameters_a_factorys_trials_counted():
    """A `trainer=` factory may train another model than `model=` names: its parameter count
    is said to be the factory's model's, not given under the catalogue name."""
    own = TrialResult(
        status=Status.OK,
        samples_per_s=100.0,
        peak_memory_gib=1.0,
        step_time_cv=0.02,
        n_params=4_386_178,
        trained_model="gpt2",
        trained_seq_len=64,
    )
    data = build([({"batch_size": 8}, own)])
    assert data.summary["model"] == "tiny (named; the trainer= factory's gpt2 has 4.4M parameters)"
    named = dataclasses.replace(own, trained_model="bert")  # the named model's type
    assert build([({"batch_size": 8}, named)]).summary["model"] == "tiny (4.4M parameters)"
