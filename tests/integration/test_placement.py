"""Where a trial runs goes with its submission (`Submission.placement`): the local executor
starts the trial's process there, from a fork server of that placement, and never sets the
search process's own environment or affinity for a trial. Real trials on one core."""

import contextlib
import os

import psutil
import pytest

from autotune import api
from autotune.common.placement import Placement
from autotune.common.trial import Status
from autotune.plan.overrides import load_config
from autotune.store.records import load_records
from autotune.study.observer import SearchObserver
from tests.integration.test_own_data import study_of
from tests.processes import command_of

pytestmark = pytest.mark.slow

PLACED = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")


class Watch(SearchObserver):
    """At each progress record of a trial: this process's placement and that of the
    descendants the search started and still alive (not those of earlier tests in this test
    process: their fork servers may live on)."""

    def __init__(self) -> None:
        self.search = []
        self.descendants = []
        self.earlier = {p.pid for p in psutil.Process().children(recursive=True)}

    def progress(self, number, progress):
        me = psutil.Process()
        self.search.append(({k: os.environ.get(k) for k in PLACED}, me.cpu_affinity()))
        for child in me.children(recursive=True):
            if child.pid in self.earlier:
                continue
            command = command_of(child)  # empty once it has ended
            if not command or "resource_tracker" in command:  # multiprocessing's own
                continue
            with contextlib.suppress(psutil.NoSuchProcess):  # it may end here too
                self.descendants.append(tuple(child.cpu_affinity()))


def test_a_trial_runs_on_its_placement_and_the_search_process_is_left_as_it_is(
    tmp_path, monkeypatch
):
    me, real = os.getpid(), os.sched_setaffinity
    set_here = []

    def watched(pid, cpus):
        if os.getpid() == me:  # not in a child between fork and exec
            set_here.append((pid, cpus))
        real(pid, cpus)

    monkeypatch.setattr(os, "sched_setaffinity", watched)
    before = ({k: os.environ.get(k) for k in PLACED}, psutil.Process().cpu_affinity())
    core = min(os.sched_getaffinity(0))
    # One worker, on one core of this machine's (the plan gives a core set to each of N).
    placement = Placement(cpus=(core,))
    monkeypatch.setattr("autotune.plan.plan.assign", lambda *_: ([placement], []))
    config = load_config(
        [
            "model=google/bert_uncased_L-2_H-128_A-2",
            "seq_len=32",
            "n_trials=2",
            "warmup_steps=1",
            "measure_steps=3",
            "confirm_rounds=0",
            "early_stop=false",
            f"out={tmp_path}",
            "study=placed",
        ]
    )
    watch = Watch()
    api.run(config, observer=watch)
    records = load_records(study_of(tmp_path / "placed"))
    assert [r.status for r in records] == [Status.OK] * 2
    # The trials trained on the placement: one torch thread (OMP_NUM_THREADS=1), one core.
    assert all(r.result.cpu_threads == 1 for r in records)
    assert watch.descendants and set(watch.descendants) == {(core,)}, watch.descendants
    # The search process: as it was, through every trial, and after.
    assert watch.search and all(seen == before for seen in watch.search), watch.search
    assert ({k: os.environ.get(k) for k in PLACED}, psutil.Process().cpu_affinity()) == before
    assert set_here == []
