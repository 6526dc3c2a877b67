"""Several processes running one study's loop (`search.loop.run_search`) on a real PostgreSQL
database, with trials that answer at once and a space of three settings, so that two processes
propose the same settings at the same moment again and again. None may measure settings
another has measured or is measuring: each settings key is launched once.
"""

import json
import multiprocessing
import subprocess
from pathlib import Path

import pytest

from autotune.execute.local import LocalExecutor
from autotune.plan import hardware
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.study import checks
from autotune.study.loop import run_search
from autotune.study.opening import open_study
from tests.conftest import TINY_MODEL, postgres_database
from tests.integration.test_sandbox_cpu import SPACE

pytestmark = pytest.mark.slow
ROUNDS = 12
PROCESSES = 3


class _Exited:
    """A trial process that has already ended, with its result written."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int:
        return 0

    def reap(self) -> None:
        pass


class InstantLauncher:
    """Answers every trial at once, in this process: only the coordination takes time."""

    def __init__(self) -> None:
        # The search kills a trial's process group when it ends: give it the id of one that
        # has ended (never 0, which would name the test's own group).
        ended = subprocess.Popen(["true"])
        ended.wait()
        self.pid = ended.pid

    def ready(self, placement) -> None:
        pass

    def start(self, spec_path: Path, result_path: Path, log_path: Path, placement) -> _Exited:
        batch = json.loads(spec_path.read_text())["params"]["batch_size"]
        result_path.write_text(
            json.dumps(
                {
                    "schema_version": 1,
                    "status": "ok",
                    "samples_per_s": 100.0 + batch,
                    "tokens_per_s": 6400.0,
                    "peak_memory_gib": batch / 64,
                    "step_time_cv": 0.01,
                    "measured_steps": 2,
                    "build_s": 0.0,
                    "train_s": 0.0,
                }
            )
        )
        return _Exited(self.pid)


def _loop(plan) -> None:
    study, plan = open_study(plan, joining=True)
    run_search(plan, study, executor=LocalExecutor(InstantLauncher()))


def launched_keys(study_dir: Path) -> list[str]:
    """The settings of every trial a process launched (its spec is written at launch)."""
    specs = sorted((study_dir / "trials").glob("*/spec.json"))
    return [checks.settings_key(json.loads(p.read_text())["params"]) for p in specs]


def test_processes_sharing_a_study_on_postgresql_never_measure_the_same_settings_twice(
    tmp_path, postgres_server_url, monkeypatch
):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    # Not the estimate: the checks under test are "measured already" and "running elsewhere".
    monkeypatch.setattr("autotune.plan.estimate.estimate_gib", lambda *a, **k: None, raising=False)
    device_info = hardware.probe()
    fork = multiprocessing.get_context("fork")
    duplicates = []
    with postgres_database(postgres_server_url) as url:
        for round_ in range(ROUNDS):
            config = load_config(
                [
                    f"model={TINY_MODEL}",
                    "seq_len=32",
                    f"space={space}",
                    "sampler=random",
                    f"seed={round_}",
                    "n_trials=4",
                    "estimate_margin=null",
                    f"storage={url}",
                    f"out={tmp_path}",
                    f"study=r{round_}",
                    "confirm_rounds=0",
                ]
            )
            plan = make_plan(config, device_info)
            plan.study_dir.mkdir()
            open_study(plan)  # as `autotune search` makes it: settings stored
            loops = [fork.Process(target=_loop, args=(plan,)) for _ in range(PROCESSES)]
            for loop in loops:
                loop.start()
            for loop in loops:
                loop.join(timeout=600)
                assert loop.exitcode == 0, f"round {round_}: a loop failed"
            keys = launched_keys(plan.study_dir)
            if len(set(keys)) != len(keys):
                duplicates.append((round_, keys))
    print(f"{ROUNDS - len(duplicates)} of {ROUNDS} rounds without a duplicate")
    assert not duplicates, f"settings launched twice: {duplicates}"
