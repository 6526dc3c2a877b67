"""Measurement conditions compared on resume, and the provenance each run stores."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.plan import conditions
from autotune.plan.run_info import RunInfo

VERSIONS = {"torch": "2.13.0", "transformers": "4.57.0", "autotune": "0.1.0"}


def info(**changes) -> RunInfo:
    made = RunInfo(
        study="s",
        model="gpt2",
        model_config={},
        task="causal_lm",
        seq_len=64,
        device="cpu",
        device_name="Xeon",
        space="cpu",
        space_notes=[],
        effective_batch_size=None,
        memory_budget_bytes=2**30,
        headroom=0.1,
        noise_cv=0.1,
        measure_steps=10,
        warmup_steps=3,
        cores_per_trial=2,
        versions=VERSIONS,
    )
    return dataclasses.replace(made, **changes)


@pytest.mark.parametrize(
    ("key", "stored", "new"),
    [
        ("measure_steps", 10, 5),
        ("warmup_steps", 3, 1),
        ("seq_len", 64, 128),
        ("cores_per_trial", 2, 1),
    ],
)
def test_a_changed_condition_is_named_with_both_values(key, stored, new):
    changed = conditions.changed_conditions(info(**{key: stored}), info(**{key: new}))
    assert [(c.key, c.stored, c.new) for c in changed] == [(key, stored, new)]
    message = conditions.refusal("s", changed)
    assert f"{key}" in message and f"the study's {stored}, this run's {new}" in message
    assert "another study= name" in message  # how to start a new study instead


def test_every_changed_condition_is_named_at_once():
    changed = conditions.changed_conditions(info(), info(measure_steps=4, warmup_steps=2))
    assert [c.key for c in changed] == ["measure_steps", "warmup_steps"]


def test_cpu_compares_cores_and_cuda_the_gpu_model():
    # On CPU the CPU model is not compared (a worker on another host may name its own)...
    assert conditions.changed_conditions(info(), info(device_name="EPYC")) == []
    cuda = info(device="cuda", device_name="NVIDIA H100 80GB HBM3")
    # ...on CUDA the GPU model is, and the host cores that only feed it are not.
    changed = conditions.changed_conditions(cuda, info(device="cuda", device_name="NVIDIA A100"))
    assert [c.key for c in changed] == ["device_name"]
    assert "the study's NVIDIA H100 80GB HBM3, this run's NVIDIA A100" in changed[0].describe()
    assert (
        conditions.changed_conditions(
            cuda, info(device="cuda", device_name=cuda.device_name, cores_per_trial=16)
        )
        == []
    )


def test_the_cores_say_what_sets_them():
    (changed,) = conditions.changed_conditions(info(), info(cores_per_trial=1))
    assert "workers=" in changed.describe()


def test_a_study_made_before_conditions_were_stored_is_not_refused():
    old = info(measure_steps=None, warmup_steps=None, cores_per_trial=None)
    assert conditions.changed_conditions(old, info(measure_steps=5, cores_per_trial=1)) == []


def test_versions_are_not_a_refused_condition():
    assert conditions.changed_conditions(info(), info(versions=VERSIONS | {"torch": "9"})) == []


def test_other_versions_names_what_differs():
    newer = VERSIONS | {"torch": "2.14.0"}
    assert conditions.other_versions(newer, VERSIONS) == "torch 2.14.0 (the study's 2.13.0)"
    assert conditions.other_versions(VERSIONS, VERSIONS) is None
    # The python version is provenance only; unknown versions (older studies) never differ.
    assert conditions.other_versions(VERSIONS | {"python": "3.12"}, VERSIONS) is None
    assert conditions.other_versions(None, VERSIONS) is None
    assert conditions.other_versions(newer, None) is None


def test_the_versions_note_says_what_happens_to_the_new_trials():
    note = conditions.versions_note("s", VERSIONS, VERSIONS | {"transformers": "5.0.0"})
    assert "transformers 5.0.0 (the study's 4.57.0)" in note
    assert "kept out of the front" in note and "new study" in note
    assert conditions.versions_note("s", VERSIONS, VERSIONS) is None


def test_the_command_line_is_kept_with_its_password_masked():
    argv = ["search", "model=gpt2", "storage=postgresql://me:s3cret@db/autotune", "out=my dir"]
    command = conditions.cli_command(argv)
    assert "s3cret" not in command
    assert command == (
        "autotune search model=gpt2 'storage=postgresql://me:***@db/autotune' 'out=my dir'"
    )


def test_an_api_call_is_kept_as_written_with_its_password_masked():
    call = conditions.api_call(
        "autotune.search",
        {
            "model": "gpt2",
            "seq_len": 64,
            "out": Path("reports"),
            "storage": "postgresql://me:s3cret@db/x?sslpassword=k3y",
        },
    )
    assert call == (
        "autotune.search(model='gpt2', seq_len=64, out='reports', "
        "storage='postgresql://me:***@db/x?sslpassword=***')"
    )


def run(command: str, started: str, ended: str | None, **changes) -> dict:
    record = conditions.run_record(
        kind="search",
        command=command,
        settings={"model": "gpt2", "seed": 7},
        info=info(),
        versions=VERSIONS,
    )
    return record | {"started": started, "ended": ended} | changes


def test_a_run_record_holds_what_reproduces_it():
    record = conditions.run_record(
        kind="search",
        command="autotune search model=gpt2",
        settings={"model": "gpt2", "seed": 7},
        info=info(),
        versions=VERSIONS,
    )
    assert record["command"] == "autotune search model=gpt2"
    assert record["settings"] == {"model": "gpt2", "seed": 7} and record["seed"] == 7
    assert record["versions"].items() >= VERSIONS.items() and "python" in record["versions"]
    assert (record["device"], record["device_name"], record["cores_per_trial"]) == (
        "cpu",
        "Xeon",
        2,
    )
    assert record["host"] and record["started"] and record["ended"] is None


def test_provenance_names_the_command_that_made_the_study_and_every_run():
    runs = [
        run("autotune search model=gpt2", "2024-01-01T10:00:00+00:00", "2024-01-01T11:00:00+00:00"),
        run(
            "autotune search model=gpt2 n_trials=40",
            "2024-01-02T10:00:00+00:00",
            "2024-01-02T12:00:00+00:00",
        ),
    ]
    made = conditions.provenance(runs)
    assert made["command"] == "autotune search model=gpt2"
    assert (made["started"], made["ended"]) == (
        "2024-01-01T10:00:00+00:00",
        "2024-01-02T12:00:00+00:00",
    )
    assert made["runs"] == runs
    assert conditions.provenance([]) is None


def test_the_summary_shows_the_command_line_first():
    runs = [run("autotune search model=gpt2", "2024-01-01T10:00:00+00:00", None)]
    lines = conditions.summary_lines(runs)
    assert next(iter(lines)) == "provenance: command"
    assert lines["provenance: command"] == "autotune search model=gpt2"
    assert lines["provenance: settings"] == "model=gpt2 seed=7"
    assert lines["provenance: seed"] == "7"
    assert "torch 2.13.0" in lines["provenance: versions"]
    assert "2 core(s) per trial" in lines["provenance: device and host"]
    assert lines["provenance: time"].endswith("still running")
    assert all(key.startswith("provenance") for key in lines)
    assert "older autotune" in conditions.summary_lines([])["provenance"]
