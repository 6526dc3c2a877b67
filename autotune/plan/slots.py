"""What each worker of a search owns, CUDA devices or a set of CPU cores (a `Placement`), as
assigned once by the plan (`assign`) from `workers=`, `devices=` and `devices_per_trial=`."""

from __future__ import annotations

import os

from autotune.common.cluster import Cluster
from autotune.common.device import DeviceInfo
from autotune.common.placement import Placement


def devices_each(workers: int | str, per_trial: int | str, devices: int) -> int:
    """The GPUs each worker owns (its trials' ranks) of `devices`: `devices_per_trial`, or
    where it is auto every device of the worker's share (one each with `workers=auto`)."""
    if per_trial != "auto":
        return int(per_trial)
    if workers == "auto":
        return 1
    return max(1, devices // int(workers))


def assign(
    workers: int | str,
    devices: str,
    device: str,
    device_info: DeviceInfo,
    per_trial: int | str = 1,
) -> tuple[list[Placement], list[str]]:
    """What each worker owns, and the problems with `workers=`, `devices=` and
    `devices_per_trial=` (all of them).

    CUDA: `devices=` names the GPUs (indices among the visible devices; auto = all); each
    worker owns `devices_each` of them, in order; `workers=auto` is as many workers as the
    devices give. CPU: `workers=auto` is one worker on every core; N workers split this
    process's cores into N disjoint sets (a trial's ranks split its worker's again)."""
    problems: list[str] = []
    if device == "cpu":
        return _cpu_slots(workers, devices, problems), problems
    return _cuda_slots(workers, devices, device_info, per_trial, problems), problems


def _cpu_slots(workers: int | str, devices: str, problems: list[str]) -> list[Placement]:
    """One worker on every core, or N workers on disjoint sets of this process's cores;
    problems added."""
    if devices != "auto":
        problems.append(f"devices={devices}: names CUDA devices; this search runs on cpu")
    if workers in ("auto", 1):
        return [Placement()]
    cores = sorted(os.sched_getaffinity(0))
    if workers > len(cores):
        problems.append(
            f"workers={workers}: each worker needs a core of its own, and this process "
            f"may use {len(cores)}"
        )
        return []
    return [Placement(cpus=tuple(part)) for part in _split(cores, workers)]


def _cuda_slots(
    workers: int | str,
    devices: str,
    device_info: DeviceInfo,
    per_trial: int | str,
    problems: list[str],
) -> list[Placement]:
    """Each worker's `devices_each` GPUs of those `devices=` names, in order; problems added."""
    names = device_info.cuda_device_names or (device_info.name,)
    indices = _named_indices(devices, len(names), problems)
    if indices is None:
        return []
    each = devices_each(workers, per_trial, len(indices))
    count = len(indices) // each if workers == "auto" else int(workers)
    if count == 0 or count * each > len(indices):
        owns = "one GPU" if each == 1 else f"devices_per_trial={each} GPUs"
        problems.append(
            f"workers={workers} x devices_per_trial={per_trial}: each worker owns {owns}, and "
            f"devices={devices} gives {len(indices)}; lower one of them"
        )
        return []
    indices = indices[: count * each]
    kinds = sorted({names[i] for i in indices})
    if len(kinds) > 1:
        problems.append(
            f"devices={devices}: the GPUs differ ({', '.join(kinds)}); one study measures one "
            "kind of GPU: name devices of one kind"
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",")] if visible else None
    groups = [indices[k * each : (k + 1) * each] for k in range(count)]
    return [
        Placement(
            cuda_devices=tuple(entries[i] if entries else str(i) for i in group),
            cuda_indices=tuple(group),
        )
        for group in groups
    ]


def _named_indices(devices: str, visible: int, problems: list[str]) -> list[int] | None:
    """The indices `devices=` names among the `visible` devices (auto: every one); None, with
    the problem added, when one of them is not there."""
    if devices == "auto":
        return list(range(visible))
    indices = [int(i) for i in devices.split(",")]
    missing = [i for i in indices if i >= visible]
    if missing:
        problems.append(
            f"devices={devices}: no device {', '.join(map(str, missing))} here "
            f"({visible} visible: 0-{visible - 1})"
        )
        return None
    return indices


def _split(items: list[int], parts: int) -> list[list[int]]:
    """`items` in `parts` contiguous runs whose sizes differ by one at most."""
    size, extra = divmod(len(items), parts)
    runs, start = [], 0
    for k in range(parts):
        end = start + size + (k < extra)
        runs.append(items[start:end])
        start = end
    return runs


def cluster_slots(
    cluster: Cluster,
    device: str,
    workers: int | str,
    per_trial: int | str,
    nodes_per_trial: int,
    cpus_per_trial: int | str,
) -> tuple[list[Placement], list[str]]:
    """A cluster's trials in flight (`workers=auto`: as many as its nodes have room for), each
    what it takes of each of its nodes, and the problems with the settings (all of them).

    A trial has `devices_per_trial` ranks (auto: one a node; on cuda across nodes, every GPU
    of each), spread evenly over `nodes_per_trial` nodes; on cuda one GPU a rank, and more
    ranks than the largest node has GPUs spread over as many nodes as they need. Its CPUs on
    each node: `cpus_per_trial`, or on cuda the node's share for its GPUs, on cpu every CPU of
    the smallest node."""
    problems: list[str] = []
    nodes = nodes_per_trial
    most_gpus = max((n.gpus for n in cluster.nodes), default=0)
    if per_trial != "auto":
        ranks = int(per_trial)
    elif nodes > 1 and device == "cuda":  # every GPU of each of its nodes
        ranks = nodes * min((n.gpus for n in cluster.nodes if n.gpus), default=1)
    else:
        ranks = nodes
    if device == "cuda" and nodes == 1 and most_gpus and ranks > most_gpus:
        nodes = -(-ranks // most_gpus)  # the fewest nodes that hold them
    if ranks % nodes:
        problems.append(
            f"devices_per_trial={per_trial} over nodes_per_trial={nodes}: each node takes an "
            "equal share of a trial's ranks; make it a multiple"
        )
        return [], problems
    gpus = ranks // nodes if device == "cuda" else 0
    usable = [n for n in cluster.nodes if n.gpus >= gpus and (gpus or device == "cpu")]
    if device == "cuda":
        kinds = sorted({n.gpu_kind for n in usable if n.gpu_kind})
        if len(kinds) > 1:
            problems.append(
                f"the cluster's GPU nodes differ ({', '.join(kinds)}); one study measures one "
                "kind of GPU: run it on a cluster of one kind"
            )
    if not usable:
        what = f"{gpus} GPU(s)" if device == "cuda" else "CPUs"
        problems.append(f"no node of the cluster ({cluster.describe()}) has {what} for a trial")
        return [], problems
    if cpus_per_trial != "auto":
        cpus = int(cpus_per_trial)
    elif gpus:
        cpus = max(1, min(n.cpus * gpus // n.gpus for n in usable))
    else:
        cpus = min(n.cpus for n in usable)
    if device == "cpu" and cpus < ranks // nodes:
        problems.append(
            f"devices_per_trial={ranks} over {nodes} node(s) with cpus_per_trial={cpus}: each "
            "rank needs a CPU of its own; raise cpus_per_trial"
        )
    parts = sum(min(n.cpus // cpus, n.gpus // gpus if gpus else n.cpus) for n in usable)
    room = parts // nodes if len(usable) >= nodes else 0
    count = room if workers == "auto" else int(workers)
    if room == 0:
        problems.append(
            f"the cluster ({cluster.describe()}) has no room for a trial of {cpus} CPU(s)"
            + (f" and {gpus} GPU(s)" if gpus else "")
            + f" on each of {nodes} node(s)"
        )
    elif count > room:
        problems.append(
            f"workers={workers}: the cluster ({cluster.describe()}) has room for {room} "
            "trial(s) at once; use workers=auto or fewer"
        )
    if problems:
        return [], problems
    slot = Placement(node_cpus=cpus, node_gpus=gpus, nodes=nodes)
    return [slot] * count, problems


def trials_per_node(cluster: Cluster, slot: Placement) -> int:
    """The most of a cluster's trials (of `slot`) that run at once on one of its nodes: they
    share its memory."""
    assert slot.node_cpus is not None
    fits = [
        min(n.cpus // slot.node_cpus, n.gpus // slot.node_gpus if slot.node_gpus else n.cpus)
        for n in cluster.nodes
    ]
    return max(1, max(fits, default=1))
