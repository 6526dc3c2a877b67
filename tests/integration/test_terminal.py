"""What a person watching sees: a line when each trial starts (piped) or a live step/ETA line
(terminal), noise and math changes marked, and `autotune report` printing the outcome too."""

from autotune import api, cli
from autotune.outputs.view import TerminalView
from autotune.plan.overrides import make_config
from tests.conftest import TINY_MODEL, fake_executor

ARGS = [f"model={TINY_MODEL}", "n_trials=3", "seq_len=32", "warmup_steps=2", "measure_steps=3"]


def test_piped_output_and_the_log_say_when_each_trial_starts(tmp_path, capsys):
    out = tmp_path / "reports"
    assert cli.main(["search", *ARGS, f"out={out}", "study=p"], executor=fake_executor("ok")) == 0
    terminal = capsys.readouterr().out
    log = (out / "p" / "search.log").read_text()
    for text in (terminal, log):
        assert "trial 0 started: bs=8 ga=1 gc=off fp32 adamw_torch_fused" in text
        assert text.index("trial 1 started:") < text.index("trial   1 ok")


class Watched(TerminalView):
    """The terminal view as on a terminal, noting each live line it shows."""

    def __init__(self) -> None:
        super().__init__(quiet=False)
        self.live = True
        self.seen: list[str] = []

    def progress(self, number, progress) -> None:
        super().progress(number, progress)
        self.seen.append(self.bar.running[number])


def test_on_a_terminal_the_running_trial_shows_its_step_and_eta(tmp_path):
    config = make_config(
        {
            "model": TINY_MODEL,
            "n_trials": 1,
            "seq_len": 32,
            "warmup_steps": 2,
            "measure_steps": 3,
            "out": tmp_path,
            "study": "t",
        }
    )
    view = Watched()
    api.run(config, observer=view, executor=fake_executor("progress"))
    assert view.seen[0].startswith("trial 0: bs=8 ga=1 gc=off fp32")
    assert "building the model" in view.seen[0]
    steps = [line.split("step ")[1] for line in view.seen if "step " in line]
    assert steps[0].startswith("0/5 (warm-up)") and steps[-1].startswith("5/5 (measuring)")
    assert any("ETA" in line for line in view.seen)
    # The log keeps plain lines only: the start of each trial, not every step.
    log = (tmp_path / "t" / "search.log").read_text()
    assert "trial 0 started:" in log and "step 3/5" not in log


def test_noise_and_changes_to_the_training_are_marked(tmp_path, capsys):
    out = tmp_path / "reports"
    # The fake measures a step CV of 1%: above noise_cv=0.5%, every trial is noisy.
    # Unconfirmed (a confirmation's figures are medians of rounds, not one noisy measurement).
    # sampler=tpe: the proposals the figures below come from (the fake's speeds).
    args = [
        f"model={TINY_MODEL}",
        "n_trials=4",
        "seq_len=32",
        "noise_cv=0.005",
        f"out={out}",
        "confirm_rounds=0",
        "sampler=tpe",
    ]
    assert cli.main(["search", *args, "study=n"], executor=fake_executor("ok")) == 0
    terminal = capsys.readouterr().out
    # The fastest is 1.07x the baseline: below math_change_min_gain, the baseline stays the pick.
    recommended = next(line for line in terminal.splitlines() if line.startswith("recommended"))
    assert recommended.startswith("recommended (*): trial 0: 108.00 samples/s (noisy: step CV 1%")
    fastest = next(line for line in terminal.splitlines() if line.startswith("fastest"))
    assert "noisy: step CV 1% on it and 1% on the baseline (above noise_cv 0.5%)" in fastest
    assert "measure_steps" in fastest
    assert "1% noisy" in terminal  # the front table's step CV column
    # The fake's throughput grows with the batch, so the pick has another effective batch.
    assert "changes the training: effective_batch_size 8 -> " in terminal
    assert "effective_batch_size=N" in terminal


def test_report_prints_the_front_and_the_picks_as_search_does(tmp_path, capsys):
    out = tmp_path / "reports"
    assert cli.main(["search", *ARGS, f"out={out}", "study=r"], executor=fake_executor("ok")) == 0
    searched = capsys.readouterr().out
    assert cli.main(["report", str(out / "r")]) == 0
    reported = capsys.readouterr().out
    outcome = searched[searched.index("Pareto front") : searched.index("wrote ")]
    assert outcome in reported
    assert "recommended (*): trial" in reported


def test_a_recommendation_that_is_also_the_memory_saver_keeps_its_figures(tmp_path, capsys):
    out = tmp_path / "reports"
    args = [f"model={TINY_MODEL}", "n_trials=1", "seq_len=32", f"out={out}", "study=one"]
    assert cli.main(["search", *args], executor=fake_executor("ok")) == 0
    terminal = capsys.readouterr().out
    assert "recommended (*): trial 0: 108.00 samples/s at 0.125 GiB" in terminal  # the baseline
    assert "memory saver (m): the same trial" in terminal
