"""The report's charts as figures: marks that stay visible where they fall on one trial, and
parallel coordinates that stay readable with a dozen knobs."""

import dataclasses

from autotune.outputs.report.figures import figures
from autotune.outputs.report.html import render_html
from tests.unit.outputs.report.test_data import build, every_outcome


def test_the_saver_mark_frames_the_recommendation_star_rather_than_hiding_under_it():
    pareto = dict(figures(every_outcome()))["pareto"]
    names = [t.name for t in pareto.data]
    star, square = (pareto.data[names.index(n)] for n in ("recommended", "memory saver"))
    # The open square is larger than the star: on the same trial, both show.
    assert square.marker.symbol.endswith("-open") and square.marker.size > star.marker.size


def test_parallel_coordinates_stay_readable_at_a_dozen_knobs():
    varied = [
        {
            "batch_size": 8,
            "grad_accum": 1,
            "gradient_checkpointing": False,
            "precision": "fp32",
            "optim": "adamw_torch",
            "attn_implementation": "sdpa",
            "torch_empty_cache_steps": 0,
            "dataloader_num_workers": 0,
            "dataloader_pin_memory": False,
            "group_by_length": False,
            "pad_to_multiple_of": 1,
        },
        {
            "batch_size": 16,
            "grad_accum": 2,
            "gradient_checkpointing": True,
            "precision": "bf16",
            "optim": "adafactor",
            "attn_implementation": "eager",
            "torch_empty_cache_steps": 10,
            "dataloader_num_workers": 2,
            "dataloader_pin_memory": True,
            "group_by_length": True,
            "pad_to_multiple_of": 8,
        },
    ]
    fixed = {"torch_compile": "off", "compile_mode": "default"}
    trials = [(params | fixed, (100.0 + 50 * i, 4.0 + i)) for i, params in enumerate(varied)]
    data = build(trials)
    # Only the knobs that varied get an axis: a fixed one is a flat line through every trial.
    assert [a.name for a in data.parallel] == [*varied[0], "peak_memory_gib", "samples_per_s"]
    labels = [a.label for a in data.parallel]
    assert labels[:3] == ["bs", "ga", "gc"]  # as the settings lines name them
    assert max(map(len, labels)) <= 11  # the long names would run into each other
    parcoords = dict(figures(data))["parallel"].data[0]
    assert parcoords.labelangle != 0  # 13 axes: titles tilted, not overlapping
    assert "Axes: bs: batch_size, ga: grad_accum, gc: gradient_checkpointing," in render_html(data)


def test_a_confirmed_picks_mark_is_drawn_at_its_confirmed_median_beside_its_own_point():
    """The star at the figure the pick is recommended on: drawn at the trial's own 250
    samples/s with a confirmed median of 310 above it, it read as the slower trial."""
    data = every_outcome()
    points = [
        dataclasses.replace(p, confirmed=(310.0, 300.0, 320.0)) if p.recommended else p
        for p in data.points
    ]
    pareto = dict(figures(dataclasses.replace(data, points=points)))["pareto"]
    traces = {t.name: t for t in pareto.data}
    assert list(traces["recommended"].y) == [310.0]
    assert 250.0 in traces["front"].y  # the trial's own measurement stays where it was
    assert list(traces["noisy (step CV above noise_cv)"].y) == [250.0]  # the figure it flags
    assert list(traces["confirmed: median [lowest-highest round]"].y) == [310.0]


def test_the_importance_legend_names_each_objective_in_words_clear_of_the_tool_bar():
    importance = dict(figures(every_outcome()))["importance"]
    assert [t.name for t in importance.data] == ["samples/s", "peak memory"]
    legend = importance.layout.legend
    assert (legend.xanchor, legend.x) == ("right", 0.98)  # inside the plot, not at its edge
