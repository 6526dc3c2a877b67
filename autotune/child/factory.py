"""The user's own Trainer factory, imported where torch may be: in each trial, and in the check
`python -m autotune.child.factory REF SEARCH_DIR` that the search runs before its first trial
(`autotune.plan.factories.check_in_subprocess`): {"ok": true} or {"error": ...} as JSON.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.common.errors import FactoryError, first_line

PARAMETERS = ("args", "model_kwargs")


def load(ref: str, search_dir: str | None = None) -> Callable[..., Any]:
    """The factory function. A module is looked up on sys.path and in `search_dir` (the
    search's working directory, as `python -m` would)."""
    where, _, function = ref.rpartition(":")
    try:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(where).stem, where)
            if spec is None or spec.loader is None or not Path(where).is_file():
                raise FactoryError(f"trainer={ref}: no such file {where}")
            # The file's own folder first on the path, as `python file.py` would put it, so
            # that `import sibling` works: the same in the check and in every trial.
            folder = str(Path(where).parent)
            if folder not in sys.path:
                sys.path.insert(0, folder)
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
        raise FactoryError(f"trainer={ref}: importing {where} failed: {first_line(exc)}") from exc
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


def main(argv: list[str]) -> int:
    """`python -m autotune.child.factory REF SEARCH_DIR`: {"ok": true} or {"error": ...}."""
    try:
        check(argv[0], argv[1])
    except FactoryError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    print(json.dumps({"ok": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
