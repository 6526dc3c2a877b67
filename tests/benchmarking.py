"""Timing checks: ratios inside one run, repeated before they fail.

A measurement on a busy 2-core machine can be spoiled by a neighbour for a few seconds; a real
regression fails every attempt. Such tests carry `@pytest.mark.benchmark` and run in a step of
their own (`python -m pytest -m benchmark`), not in the default run.
"""

import functools
import inspect
from pathlib import Path

ATTEMPTS = 3


def up_to_three_attempts(test):
    """Run the test again (in a fresh `tmp_path` folder) when an attempt fails an assertion."""
    takes_tmp_path = "tmp_path" in inspect.signature(test).parameters

    @functools.wraps(test)
    def attempts(*args, **kwargs):
        for attempt in range(1, ATTEMPTS + 1):
            if takes_tmp_path:
                folder = Path(kwargs["tmp_path"]) / f"attempt-{attempt}"
                folder.mkdir()
                kwargs = {**kwargs, "tmp_path": folder}
            try:
                return test(*args, **kwargs)
            except AssertionError:
                if attempt == ATTEMPTS:
                    raise
                print(f"attempt {attempt} of {ATTEMPTS} failed; measuring again")
        return None

    return attempts
