"""A trial on several devices: who each rank is, and the ranks started on this host as one
process group that lives and dies together, with one result. What a rank then does with its
strategy is `rank_training`'s.

A rank learns who it is from a `Rank`: here the worker makes one for each rank it forks; under
torchrun each would read it from the environment torchrun sets (`Rank.from_torchrun`), and the
same training code runs either way. A trial across nodes (`executor=ray`) runs a worker on each
node with torchrun's environment for the node (`placement.NodePart`): each forks the node's
ranks; the first node's holds the rendezvous on `MASTER_ADDR:MASTER_PORT`, and its rank 0
writes the trial's result, the other nodes' workers an `ok` of their part.

The worker holds a TCP store on a port the kernel picked (so concurrent trials never race for
one), forks `spec.devices` ranks and waits; it never initialises CUDA (nor does the fork server
it came from: `cuda_free`), so that each rank creates a context of its own, and a fork that
would inherit one is refused with the import to blame. Each rank starts a session of its own,
dies with the worker (parent-death signal), takes its share of the worker's cores, joins the
process group (gloo; NCCL on GPUs) with a bounded timeout and trains the trial with the
strategy its settings name: `ddp` through the Trainer's own DistributedDataParallel (the
environment torchrun would set), `tp` through the Trainer's tensor parallelism in that same
environment (the model built split by transformers' DistributedConfig), DeepSpeed's `zero*`
through the Trainer's `deepspeed=` config in that same environment, the `fsdp*` strategies by
FSDP2's `fully_shard` on each transformer block and the model, with the Trainer left
undistributed (on CPU the Trainer's FSDP path silently trains DDP). On GPUs every rank sees all
of its worker's devices, as under torchrun (NCCL's copies between GPUs need their peers
visible): a rank under FSDP lists its own first, since the undistributed Trainer trains on
`cuda:0`. Offloading on one GPU is a group of one rank. The figures of all ranks are gathered
on rank 0, which writes the trial's result. A rank that fails writes its own and exits 1; the
first rank to end badly ends the others at once and names the trial. Ranks end with `os._exit`:
a normal return after `destroy_process_group` can hang.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from autotune.child import cuda_free
from autotune.common.knob_values import FSDP, ZERO_STAGES
from autotune.common.knobs import value_of
from autotune.common.placement import NodePart
from autotune.common.processes import die_with_parent
from autotune.common.trial import (
    STDERR_TAIL_CHARS,
    Status,
    TrialResult,
    TrialSpec,
    write_json_atomic,
)

HOST = "127.0.0.1"
"""Every rank of a trial runs on this host: the rendezvous store and the collectives' sockets
listen on loopback alone, never on an address another host can reach."""
LOOPBACK = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
"""The collectives' sockets on loopback (unless the user's environment says otherwise)."""
GROUP_TIMEOUT = datetime.timedelta(minutes=10)
"""How long a collective waits for a rank that does not come. The trial's own timeout (the
parent's) is what ends a trial with a frozen rank; this only bounds a rank left alone."""


@dataclass(frozen=True, slots=True)
class Rank:
    rank: int
    world_size: int
    strategy: str
    on_cuda: bool = False
    bucket_view: bool = False
    """DDP's gradients as views into its buckets (the `gradient_as_bucket_view` knob)."""
    local_rank: int | None = None
    """Its place among its node's ranks (None: its `rank`, every rank on one node)."""
    local_world_size: int | None = None
    """Its node's ranks (None: `world_size`)."""
    tp_size: int = 1
    """Ranks a tensor-parallel group (`tp`): the model is built split across them."""

    @property
    def on_node(self) -> int:
        """The rank's index among its node's ranks (its GPU, its share of the cores)."""
        return self.rank if self.local_rank is None else self.local_rank

    @property
    def node_ranks(self) -> int:
        return self.world_size if self.local_world_size is None else self.local_world_size

    @classmethod
    def from_torchrun(
        cls,
        strategy: str,
        environ: Mapping[str, str] = os.environ,
        *,
        on_cuda: bool = False,
        bucket_view: bool = False,
    ) -> Rank:
        """The rank torchrun (or any launcher that sets its environment) started this process
        as: its `RANK` among `WORLD_SIZE`."""
        return cls(
            int(environ["RANK"]),
            int(environ["WORLD_SIZE"]),
            strategy,
            on_cuda=on_cuda,
            bucket_view=bucket_view,
        )

    @property
    def fsdp(self) -> bool:
        return self.strategy in FSDP

    @property
    def deepspeed(self) -> bool:
        return self.strategy in ZERO_STAGES

    @property
    def backend(self) -> str:
        """The process group's: gloo on CPU, NCCL on GPUs; FSDP's offload also reduces
        tensors on the host (the gradients' norm, for clipping), over gloo."""
        if not self.on_cuda:
            return "gloo"
        return "cpu:gloo,cuda:nccl" if self.strategy == "fsdp_offload" else "nccl"

    @property
    def trainer_distributed(self) -> bool:
        """Whether the Trainer itself runs distributed (wraps the model in DDP or DeepSpeed's
        engine, splits the data; a tensor-parallel model through accelerate's
        ParallelismConfig): under FSDP2 the shards sync the gradients, not the Trainer."""
        return self.strategy in ("ddp", "tp") or self.deepspeed

    @property
    def tensor_parallel(self) -> tuple[int, int] | None:
        """(tensor-parallel ranks a group, groups) under `tp`; None under any other."""
        if self.strategy != "tp":
            return None
        return self.tp_size, self.world_size // self.tp_size


Attempt = Callable[[Rank], tuple[TrialResult | None, bool]]
"""Runs the trial on one rank: (its result, or None on a rank other than 0; whether it failed
with an exception)."""


def needed(spec: TrialSpec) -> bool:
    """Whether the trial runs on ranks: on several devices, or offloading on one (DeepSpeed
    runs in a process group, of one rank there); not `dp`, whose one process drives them."""
    strategy = value_of(spec.params, "strategy", devices=spec.devices)
    if strategy == "dp":
        return False
    return spec.devices > 1 or strategy != "single"


def data_parallel(spec: TrialSpec) -> bool:
    """Whether the trial's one process drives several GPUs through DataParallel (`dp`)."""
    return spec.devices > 1 and value_of(spec.params, "strategy", devices=spec.devices) == "dp"


def rank_file(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.json"


def run(spec: TrialSpec, folder: Path, attempt: Attempt) -> TrialResult:
    """In the worker: fork the ranks, wait for them, return the trial's result. `single` on
    several devices is one rank on one of them (its share of the cores): the reference of
    the others' scaling efficiency."""
    strategy = value_of(spec.params, "strategy", devices=spec.devices)
    world_size = 1 if strategy == "single" else spec.devices
    part = NodePart.from_environment(os.environ)
    devices_here = spec.devices if part is None else part.local_world_size  # a core share each
    if part is not None and world_size == 1:  # `single`: one rank, on the first node
        if part.node_rank != 0:
            return TrialResult(status=Status.OK, reason="no rank of a single-rank trial here")
        part = None
    here = world_size if part is None else part.local_world_size
    first = 0 if part is None else part.first_rank
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < devices_here:
        return TrialResult(
            status=Status.INVALID_CONFIG,
            reason=f"{devices_here} devices need a core each; the trial has {len(cores)} here",
        )
    for rank in range(spec.devices):  # an earlier attempt's, in a reused folder
        rank_file(folder, rank).unlink(missing_ok=True)
    try:
        cuda_free.refuse_fork(f"the trial's {here} forked rank(s)")
    except cuda_free.CudaInitialised as exc:
        return TrialResult(status=Status.ERROR, reason=str(exc)[:300], stderr_tail=str(exc))
    host = HOST if part is None else part.master_addr
    store = None
    if part is None or part.node_rank == 0:  # the rendezvous, held while the ranks run
        listener = listener_on(host, 0 if part is None else part.master_port)
        store = dist.TCPStore(
            host,
            listener.getsockname()[1],
            world_size,
            is_master=True,
            wait_for_workers=False,
            master_listen_fd=listener.fileno(),
        )
    port = store.port if store is not None else part.master_port  # type: ignore[union-attr]
    worker = os.getpid()
    pids = {}
    for local in range(here):
        pid = os.fork()
        if pid == 0:
            _rank_main(
                Rank(
                    first + local,
                    world_size,
                    strategy,
                    on_cuda=spec.device == "cuda",
                    bucket_view=bool(spec.params.get("gradient_as_bucket_view")),
                    local_rank=local,
                    local_world_size=here,
                    tp_size=value_of(spec.params, "tp_size", devices=spec.devices),
                ),
                host,
                port,
                cores[local::devices_here],
                folder,
                attempt,
                worker,
            )
        pids[pid] = first + local
    return _wait(pids, folder, first)


def listener_on(host: str, port: int) -> socket.socket:
    """A socket listening on `host` (HOST: loopback), at `port` (0: a free one), for the
    rendezvous store to serve on: `TCPStore` given a port alone listens on every interface."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((host, port))
    listener.listen(128)
    return listener


def _rank_main(
    rank: Rank,
    host: str,
    port: int,
    cores: list[int],
    folder: Path,
    attempt: Attempt,
    worker: int,
) -> None:
    """A rank's whole life: it never returns into the worker's code it was forked from."""
    failed = True
    try:
        os.setsid()
        die_with_parent(signal.SIGKILL)
        if os.getppid() != worker:  # the worker died before the death signal was asked for
            return
        result, failed = _join_and_train(rank, host, port, cores, attempt)
        if result is not None:
            write_json_atomic(rank_file(folder, rank.rank), result.to_dict())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if failed else 0)


def _join_and_train(
    rank: Rank, host: str, port: int, cores: list[int], attempt: Attempt
) -> tuple[TrialResult | None, bool]:
    try:
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(len(cores))
        if rank.trainer_distributed:  # what torchrun sets: accelerate reads it
            os.environ.update(
                RANK=str(rank.rank),
                LOCAL_RANK=str(rank.on_node),
                WORLD_SIZE=str(rank.world_size),
                LOCAL_WORLD_SIZE=str(rank.node_ranks),
                MASTER_ADDR=host,
                MASTER_PORT=str(port),
                OMP_NUM_THREADS=str(len(cores)),  # else accelerate sets threads of its own
            )
        if host.startswith("127."):  # across nodes, the user's settings (or gloo's pick)
            for name, value in LOOPBACK.items():
                os.environ.setdefault(name, value)
        store = dist.TCPStore(host, port, rank.world_size, is_master=False, timeout=GROUP_TIMEOUT)
        if rank.on_cuda:  # the rank's own GPU, of those its worker was given
            torch.cuda.set_device(own_device_first(rank) if rank.fsdp else rank.on_node)
        dist.init_process_group(
            rank.backend,
            store=store,
            rank=rank.rank,
            world_size=rank.world_size,
            timeout=GROUP_TIMEOUT,
        )
        if rank.deepspeed:
            # DeepSpeed's communication layer, on the group just made: the model's construction
            # under ZeRO-3 (`zero.Init`, before the Trainer's own setup) asks it for the ranks.
            import deepspeed

            deepspeed.init_distributed(dist_backend=dist.get_backend())
    except Exception as exc:  # noqa: BLE001 - the rank could not join: its result says why
        result = TrialResult(
            status=Status.ERROR,
            reason=f"{type(exc).__name__}: {exc}"[:300],
            stderr_tail=traceback.format_exc()[-STDERR_TAIL_CHARS:],
        )
        return result, True
    return attempt(rank)


def own_device_first(rank: Rank) -> int:
    """Reorder this rank's `CUDA_VISIBLE_DEVICES` (its worker's devices) so that its own comes
    first, the others still visible; returns its index then, 0. Called before CUDA starts in
    the rank (the worker never starts it: its ranks are forked)."""
    # The worker's slot sets it; unset, the worker saw every GPU, its ranks the first ones.
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = listed.split(",") if listed else [str(i) for i in range(rank.node_ranks)]
    own = visible[rank.on_node]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join([own, *(v for v in visible if v != own)])
    return 0


def _wait(pids: dict[int, int], folder: Path, first: int = 0) -> TrialResult:
    """Reap the ranks; the first to end badly ends the rest and names the trial. On a node
    of a trial across nodes without rank 0 (`first`), an `ok` of its part."""
    running = dict(pids)
    while running:
        pid, status = os.wait()
        rank = running.pop(pid, None)
        if rank is None:
            continue  # not a rank
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            for other in running:
                _kill_session(other)
            for other in list(running):
                os.waitpid(other, 0)
            return _rank_failure(rank, code, folder)
    if first != 0:
        return TrialResult(status=Status.OK, reason=f"ranks {first}-{max(pids.values())} ended")
    path = rank_file(folder, 0)
    if not path.exists():
        return TrialResult(status=Status.CRASHED, reason="rank 0 ended without a result")
    return TrialResult.from_dict(json.loads(path.read_text()))


def _kill_session(pid: int) -> None:
    """A rank leads a session and process group of its own: end it with what it started."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _rank_failure(rank: int, code: int, folder: Path) -> TrialResult:
    path = rank_file(folder, rank)
    if path.exists():
        result = TrialResult.from_dict(json.loads(path.read_text()))
        return TrialResult(
            status=result.status,
            reason=f"rank {rank}: {result.reason}",
            stderr_tail=result.stderr_tail,
        )
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
    return TrialResult(status=Status.CRASHED, reason=f"rank {rank} {how}")
