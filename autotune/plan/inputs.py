"""What the trials train on, checked and described before the first one runs: the model and
its task, against what the installed transformers builds (`autotune estimate` asks the same),
the user's data (`data=`) as a `DataSpec` with what the study stores of it, and the user's
Trainer (`trainer=`) as the study stores it.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

from autotune.common.errors import DataError
from autotune.common.models import ModelSpec
from autotune.common.user_data import DataSpec, source_format
from autotune.plan import factories
from autotune.plan.config import RunConfig
from autotune.plan.space_file import SoftwareFacts


def input_problems(model: ModelSpec, task: str, seq_len: int, facts: SoftwareFacts) -> list[str]:
    """What the search refuses about the model, its task and seq_len before any trial runs;
    `autotune estimate` asks the same, so it never answers for what the search refuses."""
    problems = []
    limit = model.max_seq_len
    if limit is not None and seq_len > limit:
        problems.append(f"seq_len={seq_len}: {model.name} takes at most {limit} tokens")
    return problems + model_problems(model, task, facts)


def model_problems(model: ModelSpec, task: str, facts: SoftwareFacts) -> list[str]:
    """What the installed transformers cannot build, found before any trial runs (each check
    skipped where `facts` does not know)."""
    known, heads = facts.model_types, (facts.task_model_types or {}).get(task)
    if known and model.model_type not in known:
        close = difflib.get_close_matches(model.model_type, known, n=3)
        hint = f" (close: {', '.join(close)})" if close else ""
        return [
            f"model={model.name}: model_type {model.model_type!r} is not one transformers "
            f"{facts.transformers_version} knows{hint}"
        ]
    if heads and model.model_type not in heads:
        return [f"task={task}: transformers has no {task} head for {model.model_type} models"]
    return []


def data_spec(config: RunConfig, model: ModelSpec) -> tuple[DataSpec, dict[str, Any]]:
    """The user's data as prepared for this search, and what the study stores of it (with its
    fingerprint: other data is another study). Local paths are made absolute."""
    assert config.data
    tokenizer = config.tokenizer or model.name
    spec = DataSpec(
        data=_absolute(config.data),
        tokenizer=_absolute(tokenizer),
        seq_len=config.seq_len,
        split=config.data_split,
        text_column=config.text_column,
    )
    data_format, files = source_format(spec.data)
    try:
        fingerprint = spec.fingerprint()
    except OSError as exc:
        raise DataError(f"data={config.data}: cannot read it: {exc}") from exc
    return spec, dataclasses.asdict(spec) | {
        "fingerprint": fingerprint,
        "format": data_format,
        "files": files,
    }


def _absolute(path_or_id: str) -> str:
    """A local path made absolute; a hub id as it is."""
    path = Path(path_or_id).expanduser()
    return str(path.resolve()) if path.exists() else path_or_id


def trainer_info(ref: str, search_dir: Path) -> dict[str, str | None]:
    """What the study stores of `trainer=`: the reference (a file made absolute), the folder a
    module is looked up in, and the sha256 of the file it runs (None: no such file; the check
    says so), which a worker joining the study checks before it runs that file."""
    factory = factories.normalise(ref, search_dir)
    source = factories.source_file(factory, search_dir)
    return {
        "factory": factory,
        "search_dir": str(search_dir),
        "sha256": factories.sha256_of(source) if source else None,
    }
