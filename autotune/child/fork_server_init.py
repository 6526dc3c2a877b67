"""Imported by the fork server before anything else it preloads (`runner.PRELOAD`), and by
nothing else: the server ends, with every process of the running trial, the moment the search
that started it dies.

Left to notice its "alive" pipe closing, the server would run the interpreter's shutdown with
torch and transformers loaded (several seconds here), and its workers die only after it. Its
death signal is SIGTERM rather than SIGKILL so that it can first end the trial's whole tree:
the worker, and what the worker started in sessions of its own, which no death signal reaches.

It also keeps what the server imports next from initialising CUDA (`cuda_free`): every trial
is forked from it and needs a CUDA context of its own; and from printing, on the search's
terminal, import-time lines about nothing a trial does (`quiet_imports`).
"""

import os
import signal

from autotune.child import cuda_free, quiet_imports
from autotune.common.processes import die_with_parent, end_own_descendants


def _end_with_the_search(signum: int, frame: object) -> None:
    end_own_descendants()
    os._exit(128 + signum)


signal.signal(signal.SIGTERM, _end_with_the_search)
die_with_parent(signal.SIGTERM)
cuda_free.install()
quiet_imports.install()
