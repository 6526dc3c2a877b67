"""The user's own Trainer (`trainer=module:function` or `trainer=path/to/file.py:function`).

The factory is called as `function(args: TrainingArguments, model_kwargs: dict) -> Trainer`
with the tuned arguments; the model, data, collator and callbacks are the user's. Only child
processes import it (`autotune.child.factory`): the search process finds its file without
running it, and checks it with `python -m autotune.child.factory REF DIR` (which imports it,
and with it torch and transformers, in a process of its own), so a wrong reference or
signature is a clear error before the first trial.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from autotune.common.errors import FactoryError

CHECK_TIMEOUT_S = 120
"""How long the check may take to import the factory's module (torch and transformers take
~7 s on 2 loaded cores; a module that loads its data at import may take longer) before the
search stops, saying the import hangs."""


def normalise(ref: str, search_dir: Path) -> str:
    """A file reference made absolute (`train.py:make` -> `/home/me/train.py:make`), so trials
    and exports find it from anywhere; a module reference as it is."""
    where, _, function = ref.rpartition(":")
    if where.endswith(".py"):
        return f"{(search_dir / where).resolve()}:{function}"
    return ref


def check_in_subprocess(ref: str, search_dir: Path, *, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """`check` in a process of its own: importing the user's module imports torch.

    `-P` keeps the check's working directory off its path: trials do not have it either."""
    try:
        proc = subprocess.run(
            [sys.executable, "-P", "-m", "autotune.child.factory", ref, str(search_dir)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise FactoryError(
            f"trainer={ref}: importing it did not finish within {timeout_s:g} s: does the "
            "module wait for something, or do heavy work, when it is imported? Move that "
            "work into the factory function"
        ) from None
    lines = proc.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        message = f"trainer={ref}: checking it failed (exit {proc.returncode}):\n{tail}"
        raise FactoryError(message) from None
    if "error" in answer:
        raise FactoryError(answer["error"])


def source_file(ref: str, search_dir: Path) -> Path | None:
    """The file `load` would run for `ref`, found without running anything (no package's
    `__init__` is imported to find it): the `.py` file, or the module's source as the import
    system finds it from `search_dir` then `sys.path`. None: there is none (`check` says why)."""
    where, _, _ = ref.rpartition(":")
    if where.endswith(".py"):
        return Path(where) if Path(where).is_file() else None
    path: list[str] | None = [str(search_dir), *sys.path]
    spec = None
    for depth in range(1, where.count(".") + 2):
        if path is None:  # a module is no package: it has no submodules
            return None
        spec = _find_spec(".".join(where.split(".")[:depth]), path)
        if spec is None:
            return None
        path = list(spec.submodule_search_locations or []) or None
    origin = spec.origin if spec is not None and spec.has_location else None
    return Path(origin) if origin and Path(origin).is_file() else None


def _find_spec(name: str, path: list[str]) -> importlib.machinery.ModuleSpec | None:
    """What the import system's finders say of module `name` on `path`; unlike
    `importlib.util.find_spec`, its parent packages are not imported."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec(name, path) if find_spec else None
        if spec is not None:
            return spec
    return None


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
