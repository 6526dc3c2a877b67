"""One trial in a fresh process: `python -m autotune.child SPEC.json RESULT.json`.

The cold path (`runner.CommandLauncher`); most trials are forked from the fork server instead,
which imported the worker the same way: after `cuda_free.install`, so that importing the
Trainer leaves CUDA uninitialised and the trial's ranks can be forked from this process.
"""

import sys
import time

started_s = time.perf_counter()

from autotune.child import cuda_free, quiet_imports  # noqa: E402 - timed: it imports torch

cuda_free.install()
quiet_imports.install()

from autotune.child import worker  # noqa: E402 - after install: it imports the Trainer

sys.exit(worker.main(sys.argv[1:], imports_s=time.perf_counter() - started_s))
