"""A worker joining a study runs the Trainer factory the study names only when it is the file
the search checked (its sha256, stored with the study), or the worker's own `trainer=`."""

import hashlib

import pytest

from autotune import cli
from autotune.common.device import DeviceInfo
from autotune.common.errors import FactoryError
from autotune.plan.config import WorkerConfig
from autotune.plan.factories import source_file
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan
from autotune.store.records import run_info
from autotune.study.opening import join_config, open_study
from tests.conftest import TINY_MODEL

CPU = DeviceInfo(
    cuda_available=False,
    name="cpu",
    total_memory_bytes=2**34,
    free_memory_bytes=2**34,
    cpu_name="cpu",
    host_available_memory_bytes=2**34,
    transformers_version="5.x",
    model_types=("bert",),
    task_model_types={"sequence-classification": ("bert",)},
)


FACTORY = "def make(args, model_kwargs):\n    raise SystemExit('the factory ran')\n"


@pytest.fixture
def study_with_factory(tmp_path):
    """A study made by a search with trainer=FILE.py:make; the file's path."""
    factory = tmp_path / "code" / "train.py"
    factory.parent.mkdir()
    factory.write_text(FACTORY)
    settings = [
        f"model={TINY_MODEL}",
        f"out={tmp_path}",
        "study=t",
        "workers=1",
        f"trainer={factory}:make",
    ]
    plan = make_plan(load_config(settings), CPU)
    plan.study_dir.mkdir()
    study, _ = open_study(plan)
    stored = run_info(study).trainer
    assert stored["sha256"] == hashlib.sha256(FACTORY.encode()).hexdigest()
    return factory


def test_a_joining_worker_runs_the_factory_file_the_search_checked(tmp_path, study_with_factory):
    joined = join_config(WorkerConfig(study="t", out=tmp_path))
    assert joined.trainer == f"{study_with_factory}:make"


def test_a_worker_refuses_a_factory_file_changed_since_the_search_checked_it(
    tmp_path, study_with_factory
):
    study_with_factory.write_text(FACTORY + "import os  # someone else's code\n")
    with pytest.raises(FactoryError) as refused:
        join_config(WorkerConfig(study="t", out=tmp_path))
    said = str(refused.value)
    assert f"here {study_with_factory} holds sha256 " in said
    assert "whoever can write to that database chooses the code it runs" in said
    assert "give trainer=PATH/TO/FILE.py:make on this command line" in said


def test_autotune_worker_exits_2_before_importing_a_changed_factory(
    tmp_path, study_with_factory, capsys
):
    study_with_factory.write_text(FACTORY + "# changed\n")
    assert cli.main(["worker", "study=t", f"out={tmp_path}"]) == 2
    assert "the search checked sha256" in capsys.readouterr().err


def test_a_worker_may_run_its_own_factory_file_of_the_same_function(tmp_path, study_with_factory):
    study_with_factory.write_text(FACTORY + "# changed\n")
    mine = tmp_path / "mine.py"
    mine.write_text(FACTORY)
    joined = join_config(WorkerConfig(study="t", out=tmp_path, trainer=f"{mine}:make"))
    assert joined.trainer == f"{mine}:make"
    with pytest.raises(FactoryError, match="runs the factory function make"):
        join_config(WorkerConfig(study="t", out=tmp_path, trainer=f"{mine}:other"))


def test_a_module_factory_is_found_without_importing_its_package(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('the package ran')\n")
    (package / "train.py").write_text(FACTORY)
    assert source_file("pkg.train:make", tmp_path) == package / "train.py"
    assert source_file("pkg.nothing:make", tmp_path) is None


def test_autotune_worker_with_a_search_setting_names_the_keys_a_worker_takes(capsys):
    assert cli.main(["worker", "study=t", "model=gpt2", "n_trials=3"]) == 2
    said = capsys.readouterr().err
    takes = "a worker takes study, storage, out, workers, devices, timeout, trainer, quiet"
    assert f"model: not a setting of autotune worker: {takes}" in said
    assert "the model and the search's other settings come from the study" in said
    assert "n_trials: not a setting of autotune worker" in said
