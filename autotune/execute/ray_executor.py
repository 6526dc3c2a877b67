"""The Ray executor (`executor=ray`): each trial an actor on a node of a Ray cluster that has
room for it, with the trial's CPUs and GPUs as the actor's Ray resources; a trial across
nodes a placement group of one bundle per node, an actor on each, its ranks started with
torchrun's environment. The study stays where the search runs (SQLite on this host, or
PostgreSQL); the nodes share no folder with it: the trial's spec and data go to the node
with the task, its result and log come back in the actor's answer, its progress is asked
for while it runs.

On the node, an actor (`ray_node.TrialNode`) runs the local executor's trial (fork server,
watchdog, process group), so a trial is measured and ended there as it is on this host.
What this side adds is what a cluster does to a trial: a node that leaves mid-trial makes it
`crashed`, naming the node, and its settings run again (`TrialResult.rerun`); a trial no node
of the cluster can take (pinned to a node that left, or asking more than any node has)
fails after `PLACE_TIMEOUT_S`; a cancel ends every part with what it started, and a result
that came in meanwhile is not used. Nothing here stops the cluster or kills a process by
name: the actors it made are the only things it ends.
"""

from __future__ import annotations

import dataclasses
import io
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.common.cluster import Cluster, Node
from autotune.common.device import DeviceInfo
from autotune.common.errors import ConfigError
from autotune.common.layout import PROGRESS_FILE, RESULT_FILE, WORKER_LOG, set_aside_result
from autotune.common.output_files import make_folder
from autotune.common.placement import NodePart, Placement
from autotune.common.trial import (
    Progress,
    Status,
    TrialResult,
    spec_to_dict,
    write_json_atomic,
)
from autotune.execute.base import Submission
from autotune.execute.ray_node import TrialNode, probe

POLL_S = 0.25
PLACE_TIMEOUT_S = 60.0
"""How long a trial waits when no node alive in the cluster could ever take it (one that
left, or a request larger than any node): then it fails, `error`, instead of waiting for
ever. A trial that waits for room on a busy cluster waits as long as it must."""
LOOK_S = 2.0
"""Between two looks at the cluster's nodes while a trial waits to be placed."""
START_TIMEOUT_S = 300.0
"""Placed, the time a part may take to start its worker (the actor's fork server imports
torch) before the trial's own `timeout_s` counts."""
CANCEL_WAIT_S = 15.0
"""How long cancelled parts get to end their trial's processes before their actors are
killed (which ends those processes too: the fork server exits with its actor)."""
PART_LOG = "worker.node{}.log"
"""The log of a trial's part on its node after the first (whose log is `WORKER_LOG`)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            f"executor=ray: Ray is not installed here ({exc}); pip install 'autotune[ray]'"
        ) from None
    return ray


class RayExecutor:
    """Runs each trial on a Ray cluster's node (`address` as `ray.init` reads it: `auto`, or
    HOST:PORT of its head), connected on first use from this process, which must be a node of
    the cluster (the head, usually) or reach it through Ray Client (`ray://HOST:10001`)."""

    def __init__(self, address: str = "auto") -> None:
        self.address = address
        self._names: dict[str, str] = {}
        self._data: dict[str, Any] = {}

    def connect(self) -> None:
        ray = _ray()
        if ray.is_initialized():
            return
        try:
            ray.init(
                address=self.address,
                logging_level="ERROR",
                log_to_driver=False,
                include_dashboard=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"ray_address={self.address}: no Ray cluster answered ({exc}). Start one "
                "(ray start --head, KubeRay, ray up) and run the search on one of its nodes, "
                "or give ray_address=HOST:PORT of its head"
            ) from None

    def cluster(self) -> Cluster:
        """The cluster's live nodes, as its scheduler counts them."""
        self.connect()
        nodes = []
        for node in _ray().nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            kinds = [k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")]
            name = node.get("NodeName") or node.get("NodeManagerAddress") or node["NodeID"]
            self._names[node["NodeID"]] = name
            nodes.append(
                Node(
                    name=name,
                    node_id=node["NodeID"],
                    cpus=int(resources.get("CPU", 0)),
                    gpus=int(resources.get("GPU", 0)),
                    gpu_kind=kinds[0] if kinds else "",
                )
            )
        return Cluster(address=self.address, nodes=tuple(sorted(nodes, key=lambda n: n.name)))

    def probe(self, device: str) -> DeviceInfo:
        """The device facts of a node the trials run on (with a GPU for a cuda search)."""
        self.connect()
        task = _ray().remote(probe).options(num_cpus=1, num_gpus=1 if device == "cuda" else 0)
        return DeviceInfo.from_facts(_ray().get(task.remote()))

    def one_node(self, placement: Placement) -> Placement:
        """`placement` pinned to one node that can hold it, the first by name (the
        confirmation's: the runs it compares are measured on the same node)."""
        for node in self.cluster().nodes:
            if node.cpus >= (placement.node_cpus or 1) and node.gpus >= placement.node_gpus:
                return dataclasses.replace(placement, node_id=node.node_id)
        return placement

    def node_name(self, node_id: str) -> str:
        if node_id not in self._names:
            self.cluster()
        return self._names.get(node_id, node_id[:12])

    def data(self, folder: str) -> Any:
        """The prepared data's folder as an object in the cluster's store: sent once a search,
        unpacked by each trial's part on its node."""
        if folder not in self._data:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as archive:
                archive.add(folder, arcname=".")
            self._data[folder] = _ray().put(buffer.getvalue())
        return self._data[folder]

    def ready(self) -> None:
        self.connect()

    def submit(self, submission: Submission) -> RayTrial:
        self.connect()
        return RayTrial(self, submission)


@dataclasses.dataclass
class _Part:
    actor: Any
    where: dict[str, Any] | None = None
    run: Any = None
    """The ObjectRef of the part's `TrialNode.run`."""
    answer: dict[str, Any] | None = None


class RayTrial:
    """A trial on the cluster: its actors asked for when made, placed and started while its
    result is awaited."""

    def __init__(self, executor: RayExecutor, submission: Submission) -> None:
        ray = _ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import (
            NodeAffinitySchedulingStrategy,
            PlacementGroupSchedulingStrategy,
        )

        self.executor = executor
        self.submission = submission
        self.folder = Path(submission.place)
        if submission.within is None:
            self.folder.mkdir(parents=True, exist_ok=True)
        else:
            make_folder(self.folder, Path(submission.within))
        for stale in (RESULT_FILE, PROGRESS_FILE):
            (self.folder / stale).unlink(missing_ok=True)
        placement = submission.placement
        self.cpus = placement.node_cpus or 1
        self.gpus = placement.node_gpus
        self.nodes = placement.nodes
        self.node_id = placement.node_id
        self.group = None
        if self.nodes > 1:
            bundle = {"CPU": self.cpus} | ({"GPU": self.gpus} if self.gpus else {})
            self.group = placement_group([bundle] * self.nodes, strategy="STRICT_SPREAD")
            strategies: list[Any] = [
                PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i)
                for i in range(self.nodes)
            ]
        elif self.node_id is not None:
            strategies = [NodeAffinitySchedulingStrategy(self.node_id, soft=False)]
        else:
            strategies = ["DEFAULT"]
        actor_class = ray.remote(TrialNode)
        self.parts = [
            _Part(
                actor=actor_class.options(
                    num_cpus=self.cpus,
                    num_gpus=self.gpus,
                    max_concurrency=4,  # run, progress, cancel and close at once
                    max_restarts=0,
                    scheduling_strategy=strategy,
                ).remote()
            )
            for strategy in strategies
        ]
        self.asked = time.perf_counter()
        self.started: float | None = None
        self.last: Progress | None = None
        self.cancelled = False
        self.ended = False

    # --- the handle --------------------------------------------------------------------------

    def progress(self) -> Progress | None:
        return self.last

    def result(self, on_progress: Callable[[Progress], None] | None = None) -> TrialResult:
        if self.cancelled:
            return TrialResult(status=Status.CRASHED, reason="cancelled")
        try:
            result = self._placed() or self._run(on_progress)
        finally:
            self._end()
        if self.cancelled:  # a result that raced the cancel is not the trial's
            return TrialResult(status=Status.CRASHED, reason="cancelled")
        return self._kept(result)

    def cancel(self) -> None:
        """End every part, with what it started; a result it leaves is set aside."""
        self.cancelled = True
        if not self.ended:
            ray = _ray()
            for part in self.parts:
                part.actor.cancel.remote()
            runs = [p.run for p in self.parts if p.run is not None]
            if runs:
                ray.wait(runs, num_returns=len(runs), timeout=CANCEL_WAIT_S)
        self._end()
        set_aside_result(self.folder)

    # --- placing and running -----------------------------------------------------------------

    def _placed(self) -> TrialResult | None:
        """Wait until every part has its node; a result when the trial cannot run."""
        ray = _ray()
        asks = [part.actor.where.remote() for part in self.parts]
        unplaceable_since: float | None = None
        looked = -float("inf")
        while True:
            done, _ = ray.wait(asks, num_returns=len(asks), timeout=POLL_S)
            if len(done) == len(asks):
                break
            if time.perf_counter() - looked < LOOK_S:
                continue
            looked = time.perf_counter()  # the cluster's nodes, asked of its GCS
            if self._could_place():
                unplaceable_since = None
            elif unplaceable_since is None:
                unplaceable_since = time.perf_counter()
            elif time.perf_counter() - unplaceable_since > PLACE_TIMEOUT_S:
                return self._unplaceable(f" after {PLACE_TIMEOUT_S:.0f} s")
        for part, ask in zip(self.parts, asks, strict=True):
            try:
                part.where = ray.get(ask)
            except ray.exceptions.ActorUnschedulableError:  # pinned to a node that is gone
                return self._unplaceable("")
            except ray.exceptions.RayActorError as exc:
                return self._lost(part, exc)
        return None

    def _unplaceable(self, waited: str) -> TrialResult:
        return TrialResult(
            status=Status.ERROR,
            reason=f"no node of the cluster can take this trial ({self._asked()}){waited}: "
            + (
                f"its node {self.executor.node_name(self.node_id)} left the cluster"
                if self.node_id
                else "no live node has that much"
            ),
        )

    def _asked(self) -> str:
        gpus = f" and {self.gpus} GPU(s)" if self.gpus else ""
        nodes = f" on each of {self.nodes} nodes" if self.nodes > 1 else ""
        pinned = f" on node {self.executor.node_name(self.node_id)}" if self.node_id else ""
        return f"{self.cpus} CPU(s){gpus}{nodes}{pinned}"

    def _could_place(self) -> bool:
        """Whether the live nodes could ever hold the trial (their totals, not what is free)."""
        holding = [
            n
            for n in self.executor.cluster().nodes
            if n.cpus >= self.cpus
            and n.gpus >= self.gpus
            and (self.node_id is None or n.node_id == self.node_id)
        ]
        return len(holding) >= self.nodes

    def _run(self, on_progress: Callable[[Progress], None] | None) -> TrialResult:
        ray = _ray()
        s = self.submission
        spec = spec_to_dict(s.spec)
        data = self.executor.data(s.spec.data_dir) if s.spec.data_dir else None
        environments: list[dict[str, str]] = [{} for _ in self.parts]
        if self.nodes > 1:
            master = self.parts[0].where["address"]  # type: ignore[index]
            port = ray.get(self.parts[0].actor.free_port.remote(master))
            environments = [
                NodePart(
                    node_rank=i,
                    nodes=self.nodes,
                    world_size=s.spec.devices,
                    master_addr=master,
                    master_port=port,
                ).environment()
                for i in range(self.nodes)
            ]
        if not self.gpus:  # torch's threads: the CPUs the part was given
            for environment in environments:
                environment["OMP_NUM_THREADS"] = str(self.cpus)
        self.started = time.perf_counter()
        for part, environment in zip(self.parts, environments, strict=True):
            part.run = part.actor.run.remote(
                spec, s.timeout_s, s.memory_limit_bytes, data, environment
            )
        deadline = self.started + START_TIMEOUT_S + s.timeout_s
        asking = None
        while True:
            for part in self.parts:
                if part.answer is None and ray.wait([part.run], timeout=0)[0]:
                    try:
                        part.answer = ray.get(part.run)
                    except ray.exceptions.RayActorError as exc:
                        return self._lost(part, exc)
                    failed = self._failed(part)
                    if failed is not None:
                        return failed
            if all(part.answer is not None for part in self.parts):
                return TrialResult.from_dict(self.parts[0].answer["result"])  # type: ignore[index]
            if asking is None:
                asking = self.parts[0].actor.progress.remote()
            elif ray.wait([asking], timeout=0)[0]:
                self._heard(ray.get(asking), on_progress)
                asking = None
            if time.perf_counter() > deadline:
                return TrialResult(
                    status=Status.TIMEOUT,
                    reason="no result from the cluster before trial_timeout (and "
                    f"{START_TIMEOUT_S:.0f} s to start it)",
                )
            time.sleep(POLL_S)

    def _heard(
        self, record: dict[str, Any] | None, on_progress: Callable[[Progress], None] | None
    ) -> None:
        if record is None:
            return
        progress = Progress.from_dict(record)
        if progress == self.last:
            return
        self.last = progress
        write_json_atomic(self.folder / PROGRESS_FILE, record, fsync=False)
        if on_progress is not None:
            on_progress(progress)

    def _failed(self, part: _Part) -> TrialResult | None:
        """A part that ended badly names the trial, its node said (the others are ended)."""
        assert part.answer is not None
        result = TrialResult.from_dict(part.answer["result"])
        if result.status is Status.OK or self.nodes == 1:
            return None
        name = self._name(part)
        return dataclasses.replace(result, reason=f"node {name}: {result.reason}")

    def _lost(self, part: _Part, exc: BaseException) -> TrialResult:
        """A part's actor died under it: its node left the cluster (or was stopped)."""
        name = self._name(part)
        cause = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        return TrialResult(
            status=Status.CRASHED,
            reason=f"node {name} left the cluster mid-trial ({type(exc).__name__}: {cause})",
            rerun=True,
            node=name,
        )

    def _name(self, part: _Part) -> str:
        if part.where is None:
            return "(not yet placed)"
        return self.executor.node_name(part.where["node_id"])

    def _kept(self, result: TrialResult) -> TrialResult:
        """The trial's result with what this side knows: its nodes, its files here, its
        cost."""
        for k, part in enumerate(self.parts):
            files = part.answer["files"] if part.answer else {}
            for name, content in files.items():
                kept = name if k == 0 else PART_LOG.format(k) if name == WORKER_LOG else None
                if kept is not None:
                    (self.folder / kept).write_bytes(content)
        names = ",".join(self._name(p) for p in self.parts if p.where is not None)
        if result.wall_s is None:
            wall_s = time.perf_counter() - (self.started or self.asked)
            result = dataclasses.replace(
                result, wall_s=wall_s, device_s=wall_s * self.submission.spec.devices
            )
        result = dataclasses.replace(result, node=result.node or names or None)
        write_json_atomic(self.folder / RESULT_FILE, result.to_dict())
        return result

    def _end(self) -> None:
        """Every actor of the trial ended (its node folder removed first), its group freed."""
        if self.ended:
            return
        self.ended = True
        ray = _ray()
        closing = [p.actor.close.remote() for p in self.parts if p.where is not None]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=5.0)
        for part in self.parts:
            ray.kill(part.actor, no_restart=True)
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
