import os
import sys
import tempfile
from pathlib import Path

# Tests never reach the model hub: names outside the catalogue fail fast instead of retrying.
os.environ["HF_HUB_OFFLINE"] = "1"
# Tests never read or write the user's cache of software facts (autotune.software_cache).
os.environ["AUTOTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune-test-cache-")

TINY_MODEL = "google/bert_uncased_L-2_H-128_A-2"
FAKE_WORKER = str(Path(__file__).parent / "fakes" / "worker.py")
"""A stand-in worker: `python FAKE_WORKER MODE SPEC RESULT` behaves as MODE says."""


def fake_launcher(mode: str):
    from autotune.runner import CommandLauncher

    return CommandLauncher((sys.executable, FAKE_WORKER, mode))
