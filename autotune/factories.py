"""The user's own Trainer (`trainer=module:function` or `trainer=path/to/file.py:function`).

The factory is called as `function(args: TrainingArguments, model_kwargs: dict) -> Trainer`
with the tuned arguments; the model, data, collator and callbacks are the user's. Only worker
processes import it: the search process checks it with `python -m autotune.factories REF DIR`
(which imports it, and with it torch and transformers, in a process of its own), so a wrong
reference or signature is a clear error before the first trial.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError

PARAMETERS = ("args", "model_kwargs")
CHECK_TIMEOUT_S = 300


class FactoryError(AutotuneError):
    """The factory cannot be imported or called as `function(args, model_kwargs)`."""


def normalise(ref: str, search_dir: Path) -> str:
    """A file reference made absolute (`train.py:make` -> `/home/me/train.py:make`), so trials
    and exports find it from anywhere; a module reference as it is."""
    where, _, function = ref.rpartition(":")
    if where.endswith(".py"):
        return f"{(search_dir / where).resolve()}:{function}"
    return ref


def load(ref: str, search_dir: str | None = None) -> Callable[..., Any]:
    """The factory function. A module is looked up on sys.path and in `search_dir` (the
    search's working directory, as `python -m` would)."""
    where, _, function = ref.rpartition(":")
    try:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(where).stem, where)
            if spec is None or spec.loader is None or not Path(where).is_file():
                raise FactoryError(f"trainer={ref}: no such file {where}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses and pickling look modules up
            spec.loader.exec_module(module)
        else:
            if search_dir and search_dir not in sys.path:
                sys.path.insert(0, search_dir)
            module = importlib.import_module(where)
    except FactoryError:
        raise
    except Exception as exc:  # the user's module may raise anything while it imports
        raise FactoryError(f"trainer={ref}: importing {where} failed: {_first_line(exc)}") from exc
    factory = getattr(module, function, None)
    if not callable(factory):
        raise FactoryError(f"trainer={ref}: {where} has no function {function}")
    return factory


def signature_problem(factory: Callable[..., Any]) -> str | None:
    """Why `factory(args, model_kwargs)` cannot be called, or None."""
    try:
        inspect.signature(factory).bind(*PARAMETERS)
    except TypeError as exc:
        return f"it cannot be called as {factory.__name__}(args, model_kwargs): {exc}"
    except ValueError:  # no signature to read (a builtin): let the trial say
        return None
    return None


def check(ref: str, search_dir: str) -> None:
    """Import the factory and check its signature; raises FactoryError naming the problem."""
    factory = load(ref, search_dir)
    problem = signature_problem(factory)
    if problem:
        raise FactoryError(f"trainer={ref}: {problem}")


def check_in_subprocess(ref: str, search_dir: Path) -> None:
    """`check` in a process of its own: importing the user's module imports torch."""
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.factories", ref, str(search_dir)],
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        message = f"trainer={ref}: checking it failed (exit {proc.returncode}):\n{tail}"
        raise FactoryError(message) from None
    if "error" in answer:
        raise FactoryError(answer["error"])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def main(argv: list[str]) -> int:
    """`python -m autotune.factories REF SEARCH_DIR`: {"ok": true} or {"error": ...} as JSON."""
    try:
        check(argv[0], argv[1])
    except FactoryError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    print(json.dumps({"ok": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
