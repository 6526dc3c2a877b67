"""Can a process forked from the fork server still use the GPU? Run on a CUDA machine.

Imports the modules the server preloads, one at a time and in its order, and after each one
forks a child that puts a tensor on the GPU. A child forked after CUDA was initialised fails
("Cannot re-initialize CUDA in forked subprocess"), and so would every trial of a search. The
server imports `fork_server_init` first, which keeps the Trainer's import from initialising
CUDA (`autotune/child/cuda_free.py`): after each import a child, as a trial or as a rank
forked from a trial's worker, must still create its own context. Exits 1 when an import
initialises CUDA, naming it.

    python benchmarks/fork_cuda.py [--out fork_cuda.json]
"""

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from autotune.execute.fork_servers import SERVER_ENVIRONMENT
from autotune.execute.launchers import PRELOAD


def forked_child_uses_cuda() -> bool:
    pid = os.fork()
    if pid == 0:
        try:
            import torch

            torch.ones(1, device="cuda").sum().item()
            os._exit(0)
        except Exception as error:  # noqa: BLE001  # the child's answer is its exit code
            print(f"  forked child: {type(error).__name__}: {error}", file=sys.stderr)
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.update(SERVER_ENVIRONMENT)  # the environment a fork server starts with
    rows = []
    for name in PRELOAD:
        importlib.import_module(name)
        ok = forked_child_uses_cuda()
        rows.append({"after_import": name, "forked_child_uses_cuda": ok})
        print(f"after {name}: a forked child {'can' if ok else 'cannot'} use CUDA", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    failed = [r["after_import"] for r in rows if not r["forked_child_uses_cuda"]]
    if failed:
        from autotune.child import cuda_free

        sys.exit(f"the preload initialises CUDA after {failed[0]}: {cuda_free.first_init()}")


if __name__ == "__main__":
    main()
