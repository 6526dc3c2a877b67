"""The report's charts as figures: marks that stay visible where they fall on one trial, and
parallel coordinates that stay readable with a dozen knobs."""

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
