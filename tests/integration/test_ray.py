"""`executor=ray` on a real Ray cluster of two nodes on this machine (`tests/ray_cluster.py`:
a head and a second node, one CPU each, in a network namespace whose only interface is
loopback): trials on both nodes, a trial across the two, a node lost mid-trial, Ctrl-C, a
cancel that races a trial's end, a trial pinned to a node that is not there. After each
test: no trial's process left, and nothing of the cluster listening outside its namespace.
The search runs in the namespace as `python -m autotune search`, as a user runs it on a
cluster's head node."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TINY_MODEL
from tests.processes import command_of
from tests.ray_cluster import ADDRESS, RayCluster, can_make_namespaces

pytestmark = pytest.mark.slow

SEARCH = [
    sys.executable,
    "-m",
    "autotune",
    "search",
    f"model={TINY_MODEL}",
    "seq_len=32",
    "warmup_steps=1",
    "executor=ray",
    f"ray_address={ADDRESS}",
    # Every trial runs to its end: on a loaded machine the early stop may stop a slow one
    # ("stopped"), and these tests count the trials that ended ok on each node.
    "early_stop=false",
]
WAIT_S = 300.0
"""The most a test waits for a process of the cluster to appear or end (a loaded machine)."""


def _cluster(folder: Path) -> RayCluster:
    why_not = can_make_namespaces()
    if why_not is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the Ray tests need a network namespace: {why_not}")
        pytest.skip(f"the Ray tests need a network namespace: {why_not}")
    return RayCluster(folder).start()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One cluster for the tests that leave its nodes as they are."""
    made = _cluster(tmp_path_factory.mktemp("ray-cluster"))
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def own_cluster(tmp_path):
    """A cluster of the test's own (it loses a node)."""
    made = _cluster(tmp_path / "ray-cluster")
    try:
        yield made
    finally:
        made.stop()


def _left_clean(cluster: RayCluster) -> None:
    """No trial's actor (nor anything it started) is left, and nothing of the cluster listens
    outside its namespace, which has no interface but loopback."""
    deadline = time.monotonic() + WAIT_S
    while cluster.trial_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cluster.trial_processes() == []
    assert cluster.listeners_outside() == []
    assert cluster.interfaces() == ["lo"]


def _rows(out: Path) -> list[dict[str, str]]:
    (study,) = [p for p in out.iterdir() if p.is_dir()]
    with open(study / "trials.csv") as f:
        return list(csv.DictReader(f))


def _search(cluster: RayCluster, out: Path, *settings: str) -> str:
    done = cluster.run([*SEARCH, f"out={out}", "measure_steps=3", *settings], timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_a_search_runs_its_trials_on_both_nodes_of_the_cluster(cluster, tmp_path):
    out = tmp_path / "reports"
    printed = _search(cluster, out, "n_trials=4", "confirm_rounds=1")
    rows = _rows(out)
    assert [r["status"] for r in rows] == ["ok"] * 4, rows
    # Two in flight (workers=auto: a trial per node), so both nodes ran trials.
    assert {r["node"] for r in rows} == {"head", "second"}
    assert {r["cpu_threads"] for r in rows} == {"1"}  # the CPU Ray gave each
    (study,) = [p for p in out.iterdir() if p.is_dir()]
    recommended = json.loads((study / "recommended.json").read_text())
    assert recommended["node"] in ("head", "second")
    assert recommended["confirmation"] is not None
    assert "ran on node " in (study / "report.html").read_text()
    # Each trial's files came back to the study folder on this side.
    for row in rows:
        trial = study / "trials" / f"{int(row['number']):04d}"
        assert (trial / "result.json").is_file() and (trial / "worker.log").is_file()
    assert "search ended: 4 of 4 trials finished" in printed
    _left_clean(cluster)


def test_a_trial_across_two_nodes_trains_on_one_rank_of_each(cluster, tmp_path):
    out = tmp_path / "reports"
    _search(
        cluster,
        out,
        "n_trials=1",
        "devices_per_trial=2",
        "nodes_per_trial=2",
        "confirm_rounds=0",
    )
    (row,) = _rows(out)
    assert row["status"] == "ok", row["reason"]
    assert sorted(row["node"].split(",")) == ["head", "second"]
    assert len(row["rank_peak_memory_gib"].split(";")) == 2  # a figure from each rank
    _left_clean(cluster)


def test_a_cancel_that_races_the_trials_end_is_never_ok(cluster, tmp_path):
    """The trial has ended on its node (its answer is in), then it is cancelled before its
    result is read: the result is not the trial's."""
    code = f"""
import json, sys
import ray
from autotune.common.placement import Placement
from autotune.common.trial import TrialSpec
from autotune.execute.base import Submission
from autotune.execute.ray_executor import RayExecutor
from autotune.common.models import resolve_model

model = resolve_model({TINY_MODEL!r})
spec = TrialSpec(trial_number=0, model_name=model.name, model_config=model.config,
    task=model.default_task, seq_len=32, device="cpu", params={{"batch_size": 8}},
    warmup_steps=1, measure_steps=2, seed=0)
executor = RayExecutor({ADDRESS!r})
handle = executor.submit(Submission(spec=spec, place={str(tmp_path / "t0")!r}, timeout_s=600,
    placement=Placement(node_cpus=1)))
assert handle._placed() is None
handle._run(None)  # to its end: the answer is in
print(json.dumps(handle.parts[0].answer["result"]))
handle.cancel()
print(json.dumps(handle.result().to_dict()))
"""
    answered, result = map(json.loads, cluster.python(code).strip().splitlines()[-2:])
    assert answered["status"] == "ok", answered  # the node's answer: it ran to its end
    assert result["status"] == "crashed" and result["reason"] == "cancelled"
    _left_clean(cluster)


@pytest.mark.parametrize(
    ("asked", "says"),
    [
        ("node_cpus=1, node_id='ab' * 28", "its node abababababab left the cluster"),
        ("node_cpus=2", "after 2 s: no live node has that much"),
    ],
    ids=["pinned-to-a-node-gone", "more-than-any-node-has"],
)
def test_a_trial_no_node_can_take_fails_within_the_stated_time(cluster, tmp_path, asked, says):
    """Ray refuses a trial pinned to a node that is gone at once, and keeps one that asks more
    than any node has waiting for ever: that one fails after PLACE_TIMEOUT_S."""
    code = f"""
import json
from autotune.common.placement import Placement
from autotune.common.trial import TrialSpec
from autotune.execute import ray_executor
from autotune.execute.base import Submission

ray_executor.PLACE_TIMEOUT_S = 2.0
spec = TrialSpec(trial_number=0, model_name="m", model_config={{}}, task="t", seq_len=8,
    device="cpu", params={{}}, warmup_steps=1, measure_steps=1, seed=0)
handle = ray_executor.RayExecutor({ADDRESS!r}).submit(Submission(spec=spec,
    place={str(tmp_path / "t0")!r}, timeout_s=600, placement=Placement({asked})))
print(json.dumps(handle.result().to_dict()))
"""
    result = json.loads(cluster.python(code).strip().splitlines()[-1])
    assert result["status"] == "error"
    assert result["reason"].startswith("no node of the cluster can take this trial")
    assert says in result["reason"]
    _left_clean(cluster)


def _wait_for_a_trial(
    cluster: RayCluster, search: subprocess.Popen, log: Path, node: str | None = None
) -> None:
    """Until a trial's worker runs (a process under a trial's actor), on `node` if named."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        assert search.poll() is None, log.read_text()[-3000:]
        under = cluster.node_processes(node) if node else cluster.trial_processes()
        actors = [p for p in under if "TrialNode" in command_of(p)]
        if any(len(a.children(recursive=True)) >= 2 for a in actors):  # fork server, trial
            return
        time.sleep(0.2)
    raise AssertionError(f"no trial started on {node or 'the cluster'}: {log.read_text()}")


def test_a_node_lost_mid_trial_crashes_its_trial_and_its_settings_run_again(own_cluster, tmp_path):
    out = tmp_path / "reports"
    search = own_cluster.start_process(
        [*SEARCH, f"out={out}", "n_trials=3", "confirm_rounds=0", "measure_steps=40"],
        tmp_path / "search.log",
    )
    try:
        _wait_for_a_trial(own_cluster, search, tmp_path / "search.log", "second")
        own_cluster.kill_node("second")
        assert search.wait(timeout=1800) == 0, (tmp_path / "search.log").read_text()[-3000:]
    finally:
        if search.poll() is None:
            search.kill()
    rows = _rows(out)
    (lost,) = [r for r in rows if r["status"] == "crashed"]
    assert "node second left the cluster mid-trial" in lost["reason"]
    assert lost["node"] == "second"
    columns = list(rows[0])
    knobs = columns[columns.index("baseline") + 1 : columns.index("status")]
    again = [
        r for r in rows if r["number"] != lost["number"] and all(r[k] == lost[k] for k in knobs)
    ]
    assert again and again[0]["status"] == "ok" and again[0]["node"] == "head", rows
    # The lost trial does not count: three trials ran to their end besides it.
    assert sum(r["status"] == "ok" for r in rows) == 3
    _left_clean(own_cluster)


def test_ctrl_c_leaves_no_trial_running_on_the_cluster(cluster, tmp_path):
    out = tmp_path / "reports"
    search = cluster.start_process(
        [*SEARCH, f"out={out}", "n_trials=20", "measure_steps=200"], tmp_path / "search.log"
    )
    try:
        _wait_for_a_trial(cluster, search, tmp_path / "search.log")
        search.send_signal(signal.SIGINT)
        code = search.wait(timeout=600)
    finally:
        if search.poll() is None:
            search.kill()
    log = (tmp_path / "search.log").read_text()
    assert code == 130, log[-3000:]
    assert "interrupted" in log
    _left_clean(cluster)
