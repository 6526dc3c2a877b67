"""The user's own data (`data=`): loaded with HF `datasets`, tokenized once, cached.

A dataset is local json/jsonl/csv/parquet/text files, a `save_to_disk` folder, or a hub id
when the hub is reachable. Its rows (text, chat turns, or prompts and completions:
`autotune.child.rows`) are tokenized with the tokenizer given (a local folder or a hub id),
truncated at `seq_len`, and saved with `save_to_disk` under a folder named
by the fingerprint of everything that decides the tokens (the data files' bytes, the
tokenizer's files, the column, the split, `seq_len`), so a second preparation of the same
data is a lookup, and changed data is another cache entry. Data that already holds
`input_ids` is kept as it is (truncated).

`python -m autotune.child.prepare_data SPEC_JSON CACHE_DIR` prepares one dataset and answers
in JSON lines (`autotune.plan.user_data.prepare_in_subprocess` starts it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from autotune.child import data_checks, rows
from autotune.common.errors import DataError, first_line
from autotune.common.models import hub_offline
from autotune.common.user_data import (
    READY,
    DataSpec,
    source_format,
)

PROGRESS_INTERVAL_S = 1.0
KEPT_COLUMNS = ("input_ids", "label", "labels")
"""Of already-tokenized data (the collator makes the attention mask)."""
LENGTH_COLUMN = "length"
"""Tokens per sample, stored so that `group_by_length` does not read every sample to sort
(`TrainingArguments.length_column_name`'s default)."""


def prepare(
    spec: DataSpec, cache_dir: Path, on_progress: Callable[[str], None] = lambda text: None
) -> Path:
    """The tokenized dataset's folder in `cache_dir`, built unless it is there already;
    `on_progress` hears how far tokenizing is, about once a second.

    What `datasets` writes on the way (a local file's Arrow copy, each step's cache file) goes
    to a scratch folder in `cache_dir`, removed at the end: never into the user's data folder
    (a `save_to_disk` folder gets its `map` cache files beside its own) nor into the HF
    datasets cache in their home (a copy of every file given)."""
    target = cache_dir / spec.fingerprint()
    if (target / READY).is_file():
        return target
    import datasets

    datasets.disable_progress_bars()  # the search shows its own progress
    made = [p for p in (cache_dir, *cache_dir.parents) if not p.exists()]  # innermost first
    cache_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".loading-"))
    building = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".building-"))
    ready = False
    try:
        on_progress(f"loading data={spec.data}")
        tokenized, pad_token_id = tokenize(load(spec, scratch), spec, on_progress, scratch)
        on_progress(f"saving {len(tokenized)} tokenized rows")
        tokenized.save_to_disk(str(building))
        summary = {
            "rows": len(tokenized),
            "pad_token_id": pad_token_id,
            "max_token_id": _max_token_id(tokenized),
            "spec": dataclasses.asdict(spec),
        }
        (building / READY).write_text(json.dumps(summary))
        if not (target / READY).is_file():
            # An incomplete entry, left by a process that died; never a complete one another
            # process (a worker of the same study) finished meanwhile, which trials may be reading.
            shutil.rmtree(target, ignore_errors=True)
        with contextlib.suppress(OSError):  # another process put the same entry there first
            os.rename(building, target)
        ready = True
    finally:
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
        # Data that cannot be used leaves no folder of its making (a new study's among them).
        for folder in made if not ready else ():
            with contextlib.suppress(OSError):  # one another process uses is left
                folder.rmdir()
    return target


def load(spec: DataSpec, scratch: Path | None = None) -> Any:
    """The split of the data as a `datasets.Dataset`, its values checked (`data_checks`), or
    a DataError naming the problem. A local file's Arrow copy goes to `scratch` (default: the
    HF datasets cache); a hub dataset's download to the HF cache, as any of its users expects."""
    import datasets

    kind, files = source_format(spec.data)
    data_checks.check_files(spec.data, kind, files)
    try:
        if kind == "save_to_disk":
            loaded = datasets.load_from_disk(spec.data)
        elif kind == "hub":
            loaded = datasets.load_dataset(spec.data)
        else:
            cache = {"cache_dir": str(scratch)} if scratch is not None else {}
            loaded = datasets.load_dataset(kind, data_files=files, **cache)
    except Exception as exc:  # datasets raises many kinds; each means "unusable"
        # Its message names no line ("An error occurred while generating the dataset").
        where = data_checks.first_bad_json_line(files) if kind == "json" else None
        raise DataError(
            f"data={spec.data}: {where or f'cannot load it: {first_line(exc)}'}"
        ) from exc
    if isinstance(loaded, datasets.DatasetDict):
        if spec.split not in loaded:
            raise DataError(
                f"data_split={spec.split}: data={spec.data} has the splits {', '.join(loaded)}"
            )
        loaded = loaded[spec.split]
    if len(loaded) == 0:
        raise DataError(f"data={spec.data}: the {spec.split} split has no rows")
    _check_values(loaded, spec)
    return loaded


def layout(dataset: Any, spec: DataSpec) -> tuple[str, str]:
    """The dataset's layout and the column it reads (`rows.layout_of`), or a DataError."""
    found = rows.layout_of(
        dataset.column_names, spec.text_column, rows.turn_columns(dataset.data.schema)
    )
    if found is None:
        raise DataError(
            f"text_column={spec.text_column}: data={spec.data} has no such column (it has: "
            f"{', '.join(dataset.column_names)}); name the text column, or give input_ids, a "
            "messages column of chat turns, or prompt and completion columns"
        )
    return found


def _check_values(dataset: Any, spec: DataSpec) -> None:
    """Values a trial would train on as if right, or fail on in every trial, are refused."""
    import pyarrow

    kind, column = layout(dataset, spec)
    if kind == rows.TOKENS:
        data_checks.check_token_ids(spec.data, dataset.data.column("input_ids"))
    elif kind == rows.MESSAGES:
        data_checks.check_turns(spec.data, column, _values(dataset, column))
    elif kind == rows.PROMPT_COMPLETION:
        pairs = zip(_values(dataset, "prompt"), _values(dataset, "completion"), strict=True)
        data_checks.check_prompt_completion(spec.data, pairs)
    else:
        data_checks.check_texts(spec.data, column, _values(dataset, column))
    for column in ("label", "labels"):
        arrow_type = dataset.data.column(column).type if column in dataset.column_names else None
        # `labels` may hold a label per token (seq2seq data): only class ids are checked.
        if arrow_type is not None and not pyarrow.types.is_list(arrow_type):
            data_checks.check_labels(spec.data, column, _values(dataset, column))


def _values(dataset: Any, column: str) -> Iterable[Any]:
    """A column's values as Python objects, chunk by chunk: straight from arrow (10x faster than
    `dataset[column]`), but through `datasets` for an extension type (JSON of mixed types),
    whose arrow values are not what the row holds."""
    import pyarrow

    chunks = dataset.data.column(column).chunks
    if chunks and isinstance(chunks[0].type, pyarrow.BaseExtensionType):
        return dataset[column]
    return (value for chunk in chunks for value in chunk.to_pylist())


def tokenize(
    dataset: Any,
    spec: DataSpec,
    on_progress: Callable[[str], None] = lambda text: None,
    scratch: Path | None = None,
) -> tuple[Any, int]:
    """Token ids of each row (`rows.encode`: truncated at seq_len, no padding: trials pad per
    batch), the label column when there is one, and the id trials pad with. The steps' cache
    files go to `scratch` (default: beside the dataset's own files, as `datasets` does)."""
    kind, column = layout(dataset, spec)
    into = {"cache_file_name": str(scratch / "tokenized.arrow")} if scratch is not None else {}
    if kind == rows.TOKENS:  # tokenized already: padded with 0 unless a
        kept = [c for c in dataset.column_names if c in KEPT_COLUMNS]  # tokenizer says else
        dataset = dataset.select_columns(kept)
        truncated = dataset.map(lambda row: _with_length(row["input_ids"][: spec.seq_len]), **into)
        try:
            return truncated, _pad_token_id(load_tokenizer(spec.tokenizer))
        except DataError:
            return truncated, 0
    tokenizer = load_tokenizer(spec.tokenizer)
    chat = kind == rows.MESSAGES or (
        kind == rows.PROMPT_COMPLETION and isinstance(dataset[0]["prompt"], list)
    )
    if chat and not tokenizer.chat_template:
        raise DataError(
            f"tokenizer={spec.tokenizer}: it has no chat template, and data={spec.data} holds "
            "chat turns that it would render; give a tokenizer saved with one (its "
            "tokenizer_config.json's chat_template, or chat_template.jinja), or the rows as text"
        )
    done, shown_s = 0, time.monotonic()

    def encode(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        nonlocal done, shown_s
        try:  # the values are checked (`_check_values`): a template may still refuse them
            encoded = rows.encode(
                batch, layout=kind, column=column, tokenizer=tokenizer, seq_len=spec.seq_len
            )
        except Exception as exc:  # jinja's TemplateError, or the template's raise_exception
            raise DataError(
                f"data={spec.data}: the tokenizer's chat template refused rows {indices[0] + 1}-"
                f"{indices[-1] + 1} (counting from 1): {first_line(exc)}"
            ) from exc
        done += len(indices)
        if time.monotonic() - shown_s >= PROGRESS_INTERVAL_S:
            on_progress(f"tokenizing data: {done}/{len(dataset)} rows")
            shown_s = time.monotonic()
        return {**encoded, LENGTH_COLUMN: [len(ids) for ids in encoded["input_ids"]]}

    dropped = [c for c in dataset.column_names if c not in ("label", "labels")]
    tokenized = dataset.map(encode, batched=True, with_indices=True, remove_columns=dropped, **into)
    data_checks.check_real_tokens(
        spec.data, tokenized.data.column("input_ids"), tokenizer.all_special_ids
    )
    return tokenized, _pad_token_id(tokenizer)


def _max_token_id(dataset: Any) -> int:
    """The largest id in `input_ids`: the model's vocabulary must hold it."""
    import pyarrow.compute

    flat = pyarrow.compute.list_flatten(dataset.data.column("input_ids"))
    return int(pyarrow.compute.max(flat).as_py() or 0)


def _with_length(input_ids: list[int]) -> dict[str, Any]:
    return {"input_ids": input_ids, LENGTH_COLUMN: len(input_ids)}


def _pad_token_id(tokenizer: Any) -> int:
    """Its padding token, else its end-of-text token (GPT-2 has no pad token), else 0."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def load_tokenizer(name: str) -> Any:
    """The tokenizer, or a DataError that says where it was looked for."""
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # missing files, no network, a bad config alike
        where = "that folder" if Path(name).is_dir() else "the hub (offline here?)"
        raise DataError(
            f"tokenizer={name}: cannot load it from {where}: {first_line(exc)}; give a folder "
            "saved with save_pretrained"
        ) from exc


def main(argv: list[str]) -> int:
    """`python -m autotune.child.prepare_data SPEC_JSON CACHE_DIR`: JSON lines, {"progress": ...}
    while it works, then {"folder": ...} or {"error": ...}."""
    spec = DataSpec(**json.loads(argv[0]))
    if not (Path(spec.data).exists() and Path(spec.tokenizer).exists()) and hub_offline():
        # Without this the hub client retries for most of a minute before it gives up; in
        # offline mode what the local cache holds still loads, and the rest fails at once.
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"

    def say(text: str) -> None:
        print(json.dumps({"progress": text}), flush=True)

    try:
        folder = prepare(spec, Path(argv[1]), say)
    except DataError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    print(json.dumps({"folder": str(folder)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
