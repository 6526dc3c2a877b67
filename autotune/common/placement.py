"""Where a trial runs on its host (`Placement`): the CUDA devices of its ranks, or a set of CPU
cores. The plan gives each worker of a search one (`plan.slots.assign`); every trial it submits
carries it (`execute.base.Submission`), and the executor starts the trial's process there.
Nothing sets the search process's own environment or affinity for a trial."""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """CUDA devices (one per rank of a trial), or a set of CPU cores (None: no restriction)."""

    cuda_devices: tuple[str, ...] = ()
    """The trial's `CUDA_VISIBLE_DEVICES`: entries of the search process's (indices or UUIDs)."""
    cuda_indices: tuple[int, ...] = ()
    """Its devices' indices among the devices the search process sees."""
    cpus: tuple[int, ...] | None = None

    def describe(self) -> str:
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
