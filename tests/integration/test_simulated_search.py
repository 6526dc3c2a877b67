"""A whole search on a GPU this machine does not have: the H100's own probe facts as the device,
each trial answered by the simulated executor from the GPU twin (no process, no training),
through the public API. The parent's GPU paths (the CUDA space and its batch rule, the budget,
the estimate's skips, confirmation, the outputs) run as they would there, in seconds."""

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune import api
from autotune.common.device import DeviceInfo
from autotune.common.knobs import model_kwargs, training_args
from autotune.common.trial import Status, stopped_reason
from autotune.execute.simulated import SimulatedExecutor
from autotune.outputs.view import TerminalView
from autotune.plan.overrides import make_config
from autotune.store.outcomes import Ending
from autotune.store.records import SECOND_LOOK_ATTR
from autotune.study.interrupts import SearchInterrupted
from autotune.twin.answer import TwinAnswer
from tests.unit import installed

H100 = Path(__file__).resolve().parents[1] / "fixtures" / "probe-h100-2026-11-26.json"
ARG_FIELDS = frozenset(installed.training_arguments_fields())


def export_cli(study_dir: Path) -> str:
    return subprocess.run(
        [sys.executable, "-m", "autotune", "export", str(study_dir), "format=cli"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_a_search_on_a_simulated_h100_runs_every_stage_without_a_gpu_or_a_process(tmp_path):
    device = DeviceInfo.from_facts(json.loads(H100.read_text()))
    executor = SimulatedExecutor(TwinAnswer("H100", seed=0))
    config = make_config(
        {
            "model": "bert-large-uncased",
            "seq_len": 512,
            "effective_batch_size": 32,
            "n_trials": 8,
            "confirm_rounds": 1,
            "out": str(tmp_path),
            "study": "h100",
            "quiet": True,
            "sampler": "random",
        }
    )
    result = api.run(config, executor=executor, device_info=device)

    info = result.info
    assert info.device == "cuda" and info.device_name == "NVIDIA H100 80GB HBM3"
    records = result.snapshot.records
    ran = [r for r in records if r.status is not Status.SKIPPED]  # skips use up no trial
    assert len(ran) == 8 and records[0].baseline
    assert {r.status for r in ran} <= {Status.OK, Status.OOM, Status.STOPPED}  # losers stop early
    # Every trial the search ran was answered here, and confirmation ran the picks again.
    assert len(executor.answered) >= 8 + 2
    assert all(r.result.wall_s is not None for r in ran)  # the answer's cost, kept
    assert all(r.result.device_s == r.result.wall_s for r in ran)  # one GPU a trial
    assert executor.clock_s == sum(r.wall_s for r in executor.answered)
    # The CUDA space: batch sizes of 8 to 32 (effective batch 32), 16-bit ones included.
    assert {r.params["batch_size"] for r in ran} <= {8, 16, 32}
    assert result.recommended is not None
    fastest = max(r.result.samples_per_s or 0 for r in ran)
    assert fastest > records[0].result.samples_per_s  # the baseline (fp32, batch 8) was beaten
    for name in ("trials.csv", "pareto.csv", "recommended.json", "report.html"):
        assert (tmp_path / "h100" / name).is_file(), name
    assert not (tmp_path / "h100" / "trials").exists()  # no trial folder: no process ran
    # The exports train what was measured: the settings the worker would have recorded, from
    # the knobs' one mapping, named by the installed transformers' fields.
    recommended = json.loads((tmp_path / "h100" / "recommended.json").read_text())
    params = recommended["params"]
    expected = training_args(params, device="cuda", fields=ARG_FIELDS)
    assert recommended["training_args"] == expected
    assert expected["per_device_train_batch_size"] == params["batch_size"]
    assert recommended["model_kwargs"] == model_kwargs(params) != {}
    script = (tmp_path / "h100" / "recommended.py").read_text()
    assert "TRAINING_ARGS = {}" not in script
    assert f"'per_device_train_batch_size': {params['batch_size']}," in script
    cli = export_cli(tmp_path / "h100")
    assert f"--per_device_train_batch_size {params['batch_size']}" in cli

    # The study's picks measured again and its recommendation verified over 200 steps, on the
    # same simulated GPU: the figures agree within the twin's step noise (1%).
    confirmed = api.confirm_study(
        tmp_path / "h100", rounds=2, executor=executor, device_info=device
    )
    assert confirmed.recommended is not None
    verified, _ = api.verify_study(
        tmp_path / "h100", steps=200, executor=executor, device_info=device
    )
    assert verified.status == "ok" and verified.steps == 200
    assert abs(verified.samples_per_s_ratio - 1) < 0.05
    assert verified.peak_memory_gib == confirmed.recommended.peak_memory_gib


def test_on_a_simulated_h100_the_search_opens_with_the_baseline_then_the_experts_guess(tmp_path):
    """`autotune search model=bert-large-uncased seq_len=512` with its defaults (the default
    CUDA space, sampler=auto) on the H100's probe facts: the HF defaults, then what the guides
    advise for the card (bf16 with TF32 matmuls, fused AdamW, SDPA, no checkpointing, no
    compile, the largest batch the estimate fits in 85% of the budget), then the batch ladder;
    none of the settings that failed there (checkpointing, eager attention, 8-bit optimizers,
    max-autotune) among the first three; 7x the baseline within 10 simulated minutes."""
    device = DeviceInfo.from_facts(json.loads(H100.read_text()))
    executor = SimulatedExecutor(TwinAnswer("H100", seed=0))
    config = make_config(
        {
            "model": "bert-large-uncased",
            "seq_len": 512,
            "n_trials": 6,
            "confirm_rounds": 0,
            "out": str(tmp_path),
            "quiet": True,
        }
    )
    result = api.run(config, executor=executor, device_info=device)

    ran = [r for r in result.snapshot.records if r.status is not Status.SKIPPED]
    assert ran[0].baseline and ran[0].params["precision"] == "fp32"
    guess = ran[1].params
    assert {
        k: guess[k]
        for k in (
            "precision",
            "optim",
            "attn_implementation",
            "gradient_checkpointing",
            "torch_compile",
            "grad_accum",
        )
    } == {
        "precision": "bf16+tf32",
        "optim": "adamw_torch_fused",
        "attn_implementation": "sdpa",
        "gradient_checkpointing": False,
        "torch_compile": "off",
        "grad_accum": 1,
    }
    budget = result.info.memory_budget_gib
    assert ran[1].result.estimate_gib <= 0.85 * budget < ran[1].result.estimate_gib * 1.25
    for record in ran[:3]:
        params = record.params
        assert not params.get("gradient_checkpointing"), params
        assert params.get("attn_implementation") != "eager", params
        assert "8bit" not in params.get("optim", ""), params
        assert params.get("compile_mode") != "max-autotune", params
    # The ladder: the guess's setting at another batch.
    assert {k: v for k, v in ran[2].params.items() if k != "batch_size"} == {
        k: v for k, v in guess.items() if k != "batch_size"
    }
    baseline = ran[0].result.samples_per_s
    ended_s, best_by_10_min = 0.0, 0.0
    for record in ran:
        ended_s += record.result.wall_s
        if ended_s <= 600 and record.result.samples_per_s:
            best_by_10_min = max(best_by_10_min, record.result.samples_per_s)
    assert best_by_10_min >= 7 * baseline


def test_a_search_past_its_timeout_ends_as_a_timeout_once_and_in_the_study(tmp_path):
    """The loop's stop carries how the search ends: a timeout, said in words and stored."""
    device = DeviceInfo.from_facts(json.loads(H100.read_text()))
    config = make_config(
        {
            "model": "bert-large-uncased",
            "seq_len": 512,
            "n_trials": 50,
            "timeout": 1e-6,
            "confirm_rounds": 0,
            "out": str(tmp_path),
            "study": "late",
            "quiet": True,
        }
    )
    result = api.run(
        config, executor=SimulatedExecutor(TwinAnswer("H100", seed=0)), device_info=device
    )
    assert result.stopped.startswith("timeout: ")
    ended = result.snapshot.ended
    assert ended.how is Ending.TIMEOUT and ended.stopped == result.stopped
    assert ended.done < 50


class BusyAfterTheBaseline:
    """The twin's H100, 20 times slower while a trial may stop early: a machine that grew
    busy after the baseline ran (CI saw trials at 0.05-0.31 of a quiet baseline) and was quiet
    again for the trials that run to their end (the second look, the confirmation)."""

    def __init__(self) -> None:
        self.twin = TwinAnswer("H100", seed=0)

    def __call__(self, spec):
        if spec.stop_below_samples_per_s is None:
            return self.twin(spec)
        # 20 times slower is as if the line were 20 times higher.
        busy = self.twin(replace(spec, stop_below_samples_per_s=20 * spec.stop_below_samples_per_s))
        if busy.samples_per_s is None:
            return busy
        samples_per_s = busy.samples_per_s / 20
        reason = busy.reason
        if busy.status is Status.STOPPED:
            line = spec.stop_below_samples_per_s
            reason = stopped_reason(spec.stop_after_steps, samples_per_s, line)
        return replace(busy, samples_per_s=samples_per_s, tokens_per_s=None, reason=reason)


def busy_search(tmp_path, study):
    """The H100's facts, and a search of 4 trials confirmed in 2 rounds."""
    device = DeviceInfo.from_facts(json.loads(H100.read_text()))
    settings = {"model": "bert-large-uncased", "seq_len": 512, "n_trials": 4}
    config = make_config(
        settings | {"confirm_rounds": 2, "out": str(tmp_path), "study": study, "quiet": True}
    )
    return device, config


def test_when_every_trial_stops_against_a_quiet_baseline_the_fastest_runs_again_to_its_end(
    tmp_path,
):
    device, config = busy_search(tmp_path, "busy")
    executor = SimulatedExecutor(BusyAfterTheBaseline())
    result = api.run(config, executor=executor, device_info=device)

    ran = [r for r in result.snapshot.records if r.status is not Status.SKIPPED]
    baseline, searched, looked = ran[0], ran[1:-1], ran[-1]
    assert baseline.baseline and len(searched) == 3
    assert {r.status for r in searched} <= {Status.STOPPED, Status.OOM}
    fastest_stopped = max(
        (r for r in searched if r.status is Status.STOPPED), key=lambda r: r.result.samples_per_s
    )
    # The second look: the fastest stopped trial's settings, run to the end on the quiet machine.
    assert looked.status is Status.OK and looked.params == fastest_stopped.params
    assert looked.result.samples_per_s > 5 * baseline.result.samples_per_s
    study = optuna.load_study(
        study_name="busy", storage=f"sqlite:///{tmp_path / 'busy' / 'study.db'}"
    )
    assert study.trials[looked.number].user_attrs[SECOND_LOOK_ATTR] == fastest_stopped.number
    # It is what the search recommends, confirmed against the baseline in the rounds.
    recommended = result.recommended
    assert recommended.number == looked.number and recommended.confirmed
    assert recommended.speedup > 5
    assert result.stopped == (
        f"4 of 4 trials finished; trial {fastest_stopped.number}'s settings ran again to the "
        f"end as trial {looked.number}, at {looked.result.samples_per_s:.2f} samples/s (no "
        "other trial after the baseline had ended ok under the memory limit)"
    )
    # In the study, for the report, also where the search ended by its timeout.
    ended = result.snapshot.ended
    assert ended.describe() == result.stopped
    timed_out = replace(ended, how=Ending.TIMEOUT)
    assert timed_out.describe().startswith("stopped by timeout after 4 of 4 trials; trial ")
    # A resumed search (nothing left to run) does not look again.
    again = api.run(config, executor=executor, device_info=device)
    assert len(again.snapshot.records) == len(result.snapshot.records)


class InterruptedLook(BusyAfterTheBaseline):
    """Ctrl-C while the second look runs, the first time."""

    interrupted = False

    def __call__(self, spec):
        if spec.stop_below_samples_per_s is None and spec.trial_number > 0:
            if not InterruptedLook.interrupted:
                InterruptedLook.interrupted = True
                raise KeyboardInterrupt
        return super().__call__(spec)


def test_a_second_look_cut_off_runs_when_the_search_is_resumed(tmp_path):
    device, config = busy_search(tmp_path, "cut")
    with pytest.raises(SearchInterrupted):
        api.run(config, executor=SimulatedExecutor(InterruptedLook()), device_info=device)
    # Resumed with the same n_trials: nothing is left to search, the second look still runs,
    # counted as one trial over n_trials.
    view, lines = TerminalView(quiet=True), []
    view.report.line = lambda markup, **_: lines.append(markup)
    result = api.run(
        config, executor=SimulatedExecutor(InterruptedLook()), device_info=device, observer=view
    )
    counts = [re.match(r"\[(\d+)/(\d+)\] trial", line) for line in lines]
    assert [(int(c[1]), int(c[2])) for c in counts if c] == [(5, 5)], lines
    assert any(
        "second look at trial" in line and "one trial over n_trials" in line for line in lines
    )
    looks = [
        t
        for t in optuna.load_study(
            study_name="cut", storage=f"sqlite:///{tmp_path / 'cut' / 'study.db'}"
        ).trials
        if SECOND_LOOK_ATTR in t.user_attrs
    ]
    assert [t.state.name for t in looks] == ["FAIL", "COMPLETE"]  # cut off, then run again
    looked = next(r for r in result.snapshot.records if r.number == looks[-1].number)
    assert looked.status is Status.OK
    assert result.recommended.number == looked.number and result.recommended.confirmed
    assert "ran again to the end as trial" in result.stopped


def test_a_default_length_search_on_a_simulated_h100_compiles_its_fastest_settings_last(
    tmp_path,
):
    """The headline search's 20 trials on the H100 twin: compiling waits for the last trials,
    and comes as a refinement of the fastest eager settings so far at a batch its estimate fits
    (compiled activations take about twice the memory, and the fastest eager batch filled
    70 of the card's 79 GiB). Its compile time is told against the fastest eager trial. With
    no headroom, so that the search may use the whole budget: under the default 10% (a limit
    of 70.8 GiB) the fastest eager batch leaves compiling no room a refinement wins with, and
    the last trials go to fp8 and the optimizers."""
    device = DeviceInfo.from_facts(json.loads(H100.read_text()))
    settings = {"model": "bert-large-uncased", "seq_len": 512, "n_trials": 20, "headroom": 0}
    config = make_config({**settings, "confirm_rounds": 0, "out": str(tmp_path), "quiet": True})
    executor = SimulatedExecutor(TwinAnswer("H100", seed=0))
    result = api.run(config, executor=executor, device_info=device)

    ran = [r for r in result.snapshot.records if r.status is not Status.SKIPPED]
    compiled = [r for r in ran if r.params.get("torch_compile", "off") != "off"]
    assert len(compiled) == 1 and ran.index(compiled[0]) >= 20 - 6, [r.params for r in ran]
    (trial,) = compiled
    assert trial.status is Status.OK and trial.result.compile_s > 0
    eager = [r for r in ran if r.status is Status.OK and r not in compiled]
    fastest = max(eager, key=lambda r: r.result.samples_per_s)
    # It refines the fastest eager trial measured before it was asked (a later eager trial
    # may still edge past that one within the twin's noise).
    refined = max(
        (r for r in eager if r.number < trial.number), key=lambda r: r.result.samples_per_s
    )
    assert trial.params["batch_size"] < refined.params["batch_size"]
    differs = {k for k in trial.params if trial.params[k] != refined.params.get(k)}
    assert differs - {"batch_size", "grad_accum", "compile_mode", "compile_regional"} == {
        "torch_compile"
    }
    # On the twin, as on the H100, whole-model compile trains slower than eager.
    assert result.snapshot.compile_payoff(trial).endswith("it never pays off")
    assert f"than trial {fastest.number}, the fastest eager one" in result.snapshot.compile_payoff(
        trial
    )
