"""A search on a Ray cluster sized on its nodes (`slots.cluster_slots`): how many trials run at
once, what each takes of its nodes, and every problem with the settings named."""

import pytest

from autotune.common.cluster import Cluster, Node
from autotune.common.placement import NodePart, Placement
from autotune.plan.slots import cluster_slots, trials_per_node


def _cluster(*nodes: tuple[str, int, int]) -> Cluster:
    return Cluster(
        address="auto",
        nodes=tuple(
            Node(name=n, node_id=n * 4, cpus=c, gpus=g, gpu_kind="H100" if g else "")
            for n, c, g in nodes
        ),
    )


TWO_GPU_NODES = _cluster(("a", 32, 8), ("b", 32, 8))


def test_a_gpu_trial_takes_one_gpu_and_the_nodes_share_of_cpus_and_as_many_run_as_fit():
    slots, problems = cluster_slots(TWO_GPU_NODES, "cuda", "auto", "auto", 1, "auto")
    assert problems == []
    assert slots == [Placement(node_cpus=4, node_gpus=1, nodes=1)] * 16
    assert slots[0].describe() == "4 CPU(s) and 1 GPU(s) of a node"
    assert trials_per_node(TWO_GPU_NODES, slots[0]) == 8


def test_more_ranks_than_a_node_has_gpus_spread_over_as_many_nodes_as_they_need():
    slots, problems = cluster_slots(TWO_GPU_NODES, "cuda", "auto", 16, 1, "auto")
    assert problems == []
    assert slots == [Placement(node_cpus=32, node_gpus=8, nodes=2)]
    assert slots[0].describe() == "32 CPU(s) and 8 GPU(s) on each of 2 nodes"


def test_a_cpu_trial_takes_every_cpu_of_the_smallest_node_one_per_node():
    cluster = _cluster(("head", 4, 0), ("second", 8, 0))
    slots, problems = cluster_slots(cluster, "cpu", "auto", "auto", 1, "auto")
    assert problems == []
    assert slots == [Placement(node_cpus=4)] * 3  # 1 on head, 2 on second
    slots, _ = cluster_slots(cluster, "cpu", 2, 2, 2, 1)  # a trial across both, a rank on each
    assert slots == [Placement(node_cpus=1, nodes=2)] * 2


def test_settings_the_cluster_cannot_hold_are_named_all_at_once():
    cluster = _cluster(("head", 1, 0), ("second", 1, 0))
    assert cluster_slots(cluster, "cpu", 3, "auto", 1, "auto")[1] == [
        "workers=3: the cluster (2 nodes: head (1 CPU), second (1 CPU)) has room for 2 trial(s) "
        "at once; use workers=auto or fewer"
    ]
    assert cluster_slots(cluster, "cpu", "auto", 3, 2, "auto")[1] == [
        "devices_per_trial=3 over nodes_per_trial=2: each node takes an equal share of a "
        "trial's ranks; make it a multiple"
    ]
    assert cluster_slots(cluster, "cpu", "auto", 4, 2, 1)[1] == [
        "devices_per_trial=4 over 2 node(s) with cpus_per_trial=1: each rank needs a CPU of "
        "its own; raise cpus_per_trial"
    ]
    assert cluster_slots(cluster, "cuda", "auto", "auto", 1, "auto")[1] == [
        "no node of the cluster (2 nodes: head (1 CPU), second (1 CPU)) has 1 GPU(s) for a trial"
    ]
    assert cluster_slots(cluster, "cpu", "auto", "auto", 2, "auto")[0] == [  # a rank a node
        Placement(node_cpus=1, nodes=2)
    ]
    assert cluster_slots(cluster, "cpu", "auto", "auto", 3, "auto")[1] == [
        "the cluster (2 nodes: head (1 CPU), second (1 CPU)) has no room for a trial of 1 CPU(s) "
        "on each of 3 node(s)"
    ]
    mixed = _cluster(("a", 8, 1), ("b", 8, 1))
    mixed = Cluster(
        address="auto",
        nodes=(mixed.nodes[0], Node(name="b", node_id="bbbb", cpus=8, gpus=1, gpu_kind="A10G")),
    )
    assert cluster_slots(mixed, "cuda", "auto", "auto", 1, "auto")[1] == [
        "the cluster's GPU nodes differ (A10G, H100); one study measures one kind of GPU: run "
        "it on a cluster of one kind"
    ]


@pytest.mark.parametrize("node_rank", [0, 1, 2])
def test_a_node_part_is_told_in_torchruns_environment_and_read_back(node_rank):
    part = NodePart(
        node_rank=node_rank, nodes=3, world_size=6, master_addr="10.0.0.5", master_port=29500
    )
    environment = part.environment()
    assert environment["WORLD_SIZE"] == "6" and environment["LOCAL_WORLD_SIZE"] == "2"
    assert environment["MASTER_ADDR"] == "10.0.0.5" and environment["MASTER_PORT"] == "29500"
    assert NodePart.from_environment(environment) == part
    assert part.first_rank == 2 * node_rank
    assert NodePart.from_environment({"WORLD_SIZE": "2"}) is None  # torchrun on one node
