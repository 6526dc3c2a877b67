"""Preparing the user's data (`data=`) before the search opens its study: tokenizers come with
transformers, which imports torch, so the search process never prepares data itself;
`python -m autotune.child.prepare_data SPEC_JSON CACHE_DIR` does, in a subprocess.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.common.errors import DataError
from autotune.common.user_data import DataSpec


def prepare_in_subprocess(
    spec: DataSpec, cache_dir: Path, on_progress: Callable[[str], None] = lambda text: None
) -> Path:
    """`prepare` in a process of its own (tokenizers import torch, which the search process
    never does); its progress lines go to `on_progress`."""
    command = [sys.executable, "-m", "autotune.child.prepare_data"]
    answer: dict[str, Any] = {}
    with tempfile.TemporaryFile("w+") as errors:  # a file: a full pipe could stall the child
        proc = subprocess.Popen(
            [*command, json.dumps(dataclasses.asdict(spec)), str(cache_dir)],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                answer = json.loads(line)
            except json.JSONDecodeError:
                continue  # a library's own print
            if not isinstance(answer, dict):
                answer = {}
            elif "progress" in answer:
                on_progress(answer["progress"])
        proc.wait()
        errors.seek(0)
        stderr = errors.read()
    if "folder" in answer:
        return Path(answer["folder"])
    if "error" in answer:
        raise DataError(answer["error"])
    raise DataError(
        f"data={spec.data}: preparing it failed (exit {proc.returncode}):\n{stderr[-2000:]}"
    )
