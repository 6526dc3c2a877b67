"""What a cluster has room for (`Cluster`, its `Node`s): read by a cluster executor from the
cluster itself (`execute.ray_executor`), and what the plan sizes a search on it from
(`plan.slots.cluster_slots`). Nothing here talks to a cluster."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Node:
    """One node of a cluster, as its scheduler counts it."""

    name: str
    """How people and the outputs call it: the node's name, else its address."""
    node_id: str
    cpus: int
    gpus: int
    gpu_kind: str = ""
    """The node's accelerator type as the scheduler labels it (`H100`), if it says."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    address: str
    """Where the search reached it (as given: `auto`, HOST:PORT)."""
    nodes: tuple[Node, ...]

    def describe(self) -> str:
        many = "s" * (len(self.nodes) != 1)
        parts = ", ".join(
            f"{n.name} ({n.cpus} CPU{'s' * (n.cpus != 1)}"
            + (f", {n.gpus} GPU{'s' * (n.gpus != 1)}" if n.gpus else "")
            + ")"
            for n in self.nodes
        )
        return f"{len(self.nodes)} node{many}: {parts}"
