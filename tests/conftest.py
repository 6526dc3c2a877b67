import os
import sys
from pathlib import Path

# Tests never reach the model hub: names outside the catalogue fail fast instead of retrying.
os.environ["HF_HUB_OFFLINE"] = "1"

TINY_MODEL = "google/bert_uncased_L-2_H-128_A-2"
FAKE_WORKER = str(Path(__file__).parent / "fakes" / "worker.py")
"""A stand-in worker: `python FAKE_WORKER MODE SPEC RESULT` behaves as MODE says."""


def fake_launcher(mode: str):
    from autotune.runner import CommandLauncher

    return CommandLauncher((sys.executable, FAKE_WORKER, mode))
