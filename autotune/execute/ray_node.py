"""What a Ray executor runs on a cluster's node (`execute.ray_executor` starts it there): one
part of one trial, as an actor of its own (`TrialNode`), and the device probe of a node
(`probe`).

A part is the local executor's trial on that node: its worker forked from a fork server of
the actor's, in a folder of the node's own, its timeout and memory watched there, everything
it started ended with it. The trial's files (its result, its log) go back to the driver as
the actor's answer: no folder is shared with the driver. For a trial across nodes, each
node's part starts its ranks with torchrun's environment (`ranks.NODE_ENVIRONMENT`), which
the actor's process sets for itself: it runs this part alone, and its fork server and
worker inherit it.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import socket
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any

from autotune.common.layout import PROGRESS_FILE, WORKER_LOG
from autotune.common.trial import (
    Status,
    TrialResult,
    read_progress,
    spec_from_dict,
)
from autotune.execute.base import Submission
from autotune.execute.local import LocalExecutor, LocalTrial

TEMP_PREFIX = "autotune-ray-"
"""The node-side folder of a trial's part (in the node's temporary folder), removed after it."""


class TrialNode:
    """One part of a trial on the node Ray placed this actor on. Its methods run in threads of
    their own (the actor's `max_concurrency`): `run` waits for the trial while `progress` and
    `cancel` answer."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
        self.trial_folder = self.folder / "trial"
        self.lock = threading.Lock()
        self.trial: LocalTrial | None = None
        self.cancelled = False

    def where(self) -> dict[str, Any]:
        """The node this part runs on, and its address (a trial across nodes meets there)."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "address": ray.util.get_node_ip_address(),
        }

    def free_port(self, address: str) -> int:
        """A port free now on `address` of this node, for rank 0's rendezvous (as torchrun
        picks one; the part that listens on it starts right after)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe_socket:
            probe_socket.bind((address, 0))
            return probe_socket.getsockname()[1]

    def run(
        self,
        spec: dict[str, Any],
        timeout_s: float,
        memory_limit_bytes: int | None,
        data: bytes | None,
        environment: dict[str, str],
    ) -> dict[str, Any]:
        """Run the part: its result, and the trial's files as bytes (`files`)."""
        os.environ.update(environment)  # this actor's process runs this one part
        spec = dict(spec)
        if data is not None:  # the prepared data, unpacked where the worker reads it
            data_dir = self.folder / "data"
            with tarfile.open(fileobj=io.BytesIO(data)) as archive:
                archive.extractall(data_dir, filter="data")
            spec["data_dir"] = str(data_dir)
        spec["compile_cache_dir"] = str(self.folder / "compile-cache")
        spec["trainer_dir"] = str(self.folder)
        submission = Submission(
            spec=spec_from_dict(spec),
            place=str(self.trial_folder),
            timeout_s=timeout_s,
            memory_limit_bytes=memory_limit_bytes,
        )
        with self.lock:
            if self.cancelled:
                return {"result": _cancelled().to_dict(), "files": {}}
            self.trial = LocalExecutor().submit(submission)
        result = self.trial.result()
        files = {
            name: (self.trial_folder / name).read_bytes()
            for name in (WORKER_LOG,)
            if (self.trial_folder / name).is_file()
        }
        return {"result": result.to_dict(), "files": files}

    def progress(self) -> dict[str, Any] | None:
        record = read_progress(self.trial_folder / PROGRESS_FILE)
        return None if record is None else record.to_dict()

    def cancel(self) -> None:
        """End the part now, with everything it started."""
        with self.lock:
            self.cancelled = True
            if self.trial is not None:
                self.trial.cancel()

    def close(self) -> None:
        """Remove the part's folder (after its files went back)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _cancelled() -> TrialResult:
    return TrialResult(status=Status.CRASHED, reason="cancelled before it started")


def probe() -> dict[str, Any]:
    """The device facts of the node this task runs on, as the local probe gives them."""
    from autotune.plan.software_cache import probe_device

    return dataclasses.asdict(probe_device())
