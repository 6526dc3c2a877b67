"""Which Trainer factory a worker joining a study runs (`autotune worker`).

The study names its factory (`trainer=`), and a joining worker runs it on its own host, as its
own user. Whoever can write to the study's database could name other code, so a worker runs
the file the study names only when its content is the one the search checked (its sha256,
stored with the study), or the file its own `trainer=` names, which its user chose.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.common.errors import FactoryError
from autotune.plan.factories import sha256_of, source_file

TRUST = (
    "A worker runs the Trainer factory the study's database names, on this host, as this "
    "user: whoever can write to that database chooses the code it runs"
)


def factory_to_run(
    stored: dict[str, Any] | None, own: str | None, search_dir: Path, study: str
) -> str | None:
    """The `trainer=` reference a worker joining `study` runs: its own `own` (which must name
    the study's function), else the study's `stored` one (`RunInfo.trainer`) when the file it
    names here is the one the search checked; None when the study has no factory. Raises a
    FactoryError saying why not, without running anything."""
    if stored is None:
        if own is not None:
            raise FactoryError(
                f"trainer={own}: study={study} was made without trainer= (autotune "
                "builds its Trainer): leave trainer= out"
            )
        return None
    factory = stored["factory"]
    function = factory.rpartition(":")[2]
    if own is not None:
        if own.rpartition(":")[2] != function:
            raise FactoryError(
                f"trainer={own}: study={study} runs the factory function "
                f"{function} (trainer={factory}); name a {function} of your "
                "own, or leave trainer= out"
            )
        return own
    expected = stored.get("sha256")
    source = source_file(factory, search_dir)
    found = sha256_of(source) if source else None
    if expected is None or found != expected:
        here = f"here {source} holds sha256 {found}" if source else "there is no such file here"
        checked = f"sha256 {expected}" if expected else "no content hash (an older autotune)"
        raise FactoryError(
            f"trainer={factory}: study={study} names this factory to run, and {here}; the "
            f"search checked {checked}. {TRUST}. Run the file the search ran, or give "
            f"trainer=PATH/TO/FILE.py:{function} on this command line to run a file you trust"
        )
    return factory


def describe(ref: str, search_dir: Path) -> str:
    """`/home/me/train.py (sha256 ...)`: what running `ref` runs, for a worker to show."""
    source = source_file(ref, search_dir)
    return f"{source} (sha256 {sha256_of(source)})" if source else f"{ref} (no such file here)"
