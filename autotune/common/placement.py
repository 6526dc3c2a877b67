"""Where a trial runs (`Placement`): on this host, the CUDA devices of its ranks or a set of CPU
cores; on a cluster, what it takes of each node it runs on and how many nodes. The plan gives
each worker of a search one (`plan.slots.assign`, `plan.slots.cluster_slots`); every trial it
submits carries it (`execute.base.Submission`), and the executor starts the trial's process
there. Nothing sets the search process's own environment or affinity for a trial."""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """CUDA devices (one per rank of a trial), or a set of CPU cores (None: no restriction);
    on a cluster, the CPUs and GPUs of each of its `nodes` (a trial across nodes: more than
    one), and the node it must run on (`node_id`), if one."""

    cuda_devices: tuple[str, ...] = ()
    """The trial's `CUDA_VISIBLE_DEVICES`: entries of the search process's (indices or UUIDs)."""
    cuda_indices: tuple[int, ...] = ()
    """Its devices' indices among the devices the search process sees."""
    cpus: tuple[int, ...] | None = None
    node_cpus: int | None = None
    """On a cluster: the CPUs the trial takes on each of its nodes (None: not on a cluster)."""
    node_gpus: int = 0
    """On a cluster: the GPUs the trial takes on each of its nodes (its ranks there)."""
    nodes: int = 1
    """On a cluster: the nodes the trial's ranks are spread over, one part on each."""
    node_id: str | None = None
    """On a cluster: the one node the trial must run on (the confirmation's); None: any."""

    @property
    def on_cluster(self) -> bool:
        return self.node_cpus is not None

    def describe(self) -> str:
        if self.on_cluster:
            gpus = f" and {self.node_gpus} GPU(s)" if self.node_gpus else ""
            spread = f" on each of {self.nodes} nodes" if self.nodes > 1 else " of a node"
            return f"{self.node_cpus} CPU(s){gpus}{spread}"
        if self.cuda_devices:
            many = "s" * (len(self.cuda_devices) > 1)
            return f"cuda device{many} {','.join(self.cuda_devices)}"
        if self.cpus is not None:
            return f"cores {_ranges(self.cpus)}"
        return "every core"

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a trial's process placed here: `base` (default: this process's)
        with its devices and, on a set of cores, torch's thread count (sized from
        OMP_NUM_THREADS when the fork server imports it)."""
        env = dict(os.environ if base is None else base)
        if self.cuda_devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.cuda_devices)
        if self.cpus is not None:
            env["OMP_NUM_THREADS"] = str(len(self.cpus))
        return env

    def pin(self, pid: int = 0) -> None:
        """Keep process `pid` (0: the calling one, as in a child before it execs) on the
        placement's cores; nothing without a set of them."""
        if self.cpus is not None:
            os.sched_setaffinity(pid, self.cpus)


def _ranges(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> `0-2,5`."""
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NodePart:
    """One node's share of a trial across nodes: its ranks, and where rank 0 meets them.
    Told to the node's worker in torchrun's environment (`environment`, `from_environment`):
    `GROUP_RANK` is the node's place, `LOCAL_WORLD_SIZE` its ranks, `WORLD_SIZE` the trial's,
    `MASTER_ADDR`:`MASTER_PORT` rank 0's rendezvous."""

    node_rank: int
    nodes: int
    world_size: int
    master_addr: str
    master_port: int

    @property
    def local_world_size(self) -> int:
        return self.world_size // self.nodes

    @property
    def first_rank(self) -> int:
        return self.node_rank * self.local_world_size

    def environment(self) -> dict[str, str]:
        return {
            "GROUP_RANK": str(self.node_rank),
            "GROUP_WORLD_SIZE": str(self.nodes),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    @classmethod
    def from_environment(cls, environ: dict[str, str] | os._Environ) -> NodePart | None:
        """The part this process runs, None where it is not one (no `GROUP_RANK`)."""
        if "GROUP_RANK" not in environ:
            return None
        return cls(
            node_rank=int(environ["GROUP_RANK"]),
            nodes=int(environ["GROUP_WORLD_SIZE"]),
            world_size=int(environ["WORLD_SIZE"]),
            master_addr=environ["MASTER_ADDR"],
            master_port=int(environ["MASTER_PORT"]),
        )
