"""The user's own data (`data=`): loaded with HF `datasets`, tokenized once, cached.

A dataset is local json/jsonl/csv/parquet/text files, a `save_to_disk` folder, or a hub id
when the hub is reachable. Its text column is tokenized with the tokenizer given (a local
folder or a hub id), truncated at `seq_len`, and saved with `save_to_disk` under a folder named
by the fingerprint of everything that decides the tokens (the data files' bytes, the
tokenizer's files, the column, the split, `seq_len`), so a second preparation of the same
data is a lookup, and changed data is another cache entry. Data that already holds
`input_ids` is kept as it is (truncated).

Tokenizers come with transformers, which imports torch: the search process never prepares
data itself; `python -m autotune.user_data SPEC_JSON CACHE_DIR` does, in a subprocess.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError

BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet",
            ".txt": "text"}  # fmt: skip
"""File suffix -> the `datasets` builder that reads it."""
READY = "autotune-ready.json"
"""Written last into a cache entry: an entry without it is incomplete and is rebuilt."""
KEPT_COLUMNS = ("input_ids", "attention_mask", "label", "labels")


class DataError(AutotuneError):
    """The data or its tokenizer cannot be used; the message names the setting."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DataSpec:
    data: str
    """Files, a folder of them, a `save_to_disk` folder, or a hub id."""
    tokenizer: str
    """A local folder (`save_pretrained`) or a hub id."""
    seq_len: int
    split: str = "train"
    text_column: str = "text"

    def fingerprint(self) -> str:
        """Hex digest of everything that decides the tokens."""
        digest = hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode())
        for path in (*_files(Path(self.data)), *_files(Path(self.tokenizer))):
            digest.update(path.name.encode())
            with open(path, "rb") as f:
                for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                    digest.update(chunk)
        return digest.hexdigest()[:16]


def _is_saved_dataset(path: Path) -> bool:
    """A folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk`."""
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def _files(path: Path) -> list[Path]:
    """The files under a local path, in a stable order; none for a hub id."""
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return []


def prepare(spec: DataSpec, cache_dir: Path) -> Path:
    """The tokenized dataset's folder in `cache_dir`, built unless it is there already."""
    target = cache_dir / spec.fingerprint()
    if (target / READY).is_file():
        return target
    import datasets

    datasets.disable_progress_bars()  # the search shows its own progress
    tokenized, pad_token_id = tokenize(load(spec), spec)
    cache_dir.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".building-"))
    try:
        tokenized.save_to_disk(str(building))
        summary = {
            "rows": len(tokenized),
            "pad_token_id": pad_token_id,
            "spec": dataclasses.asdict(spec),
        }
        (building / READY).write_text(json.dumps(summary))
        shutil.rmtree(target, ignore_errors=True)  # an incomplete entry (no READY file)
        with contextlib.suppress(OSError):  # another process put the same entry there first
            os.rename(building, target)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def load(spec: DataSpec) -> Any:
    """The split of the data as a `datasets.Dataset`, or a DataError naming the problem."""
    import datasets

    path = Path(spec.data)
    try:
        if _is_saved_dataset(path):
            loaded = datasets.load_from_disk(str(path))
        elif path.exists():
            files = _files(path)
            kinds = {BUILDERS.get(p.suffix.lower()) for p in files}
            if not files or None in kinds or len(kinds) > 1:
                found = ", ".join(sorted({p.suffix or p.name for p in files})) or "no files"
                raise DataError(
                    f"data={spec.data}: cannot tell its format (found {found}); give "
                    f"{', '.join(BUILDERS)} files of one kind, or a save_to_disk folder"
                )
            loaded = datasets.load_dataset(kinds.pop(), data_files=[str(p) for p in files])
        elif path.suffix.lower() in BUILDERS or spec.data.startswith((".", "/", "~")):
            raise DataError(f"data={spec.data}: no such file or folder")
        else:
            loaded = datasets.load_dataset(spec.data)  # a hub id
    except DataError:
        raise
    except Exception as exc:  # datasets raises many kinds; each means "unusable"
        raise DataError(f"data={spec.data}: cannot load it: {_first_line(exc)}") from exc
    if isinstance(loaded, datasets.DatasetDict):
        if spec.split not in loaded:
            raise DataError(f"data_split={spec.split}: data={spec.data} has the splits "
                            f"{', '.join(loaded)}")  # fmt: skip
        loaded = loaded[spec.split]
    if len(loaded) == 0:
        raise DataError(f"data={spec.data}: the {spec.split} split has no rows")
    if "input_ids" not in loaded.column_names and spec.text_column not in loaded.column_names:
        raise DataError(
            f"text_column={spec.text_column}: data={spec.data} has no such column (it has: "
            f"{', '.join(loaded.column_names)}); name the text column, or give input_ids"
        )
    return loaded


def tokenize(dataset: Any, spec: DataSpec) -> tuple[Any, int]:
    """Token ids of the text column (truncated at seq_len, no padding: trials pad per batch),
    the label column when there is one, and the id trials pad with."""
    if "input_ids" in dataset.column_names:  # tokenized already: padded with 0 unless a
        kept = [c for c in dataset.column_names if c in KEPT_COLUMNS]  # tokenizer says else
        dataset = dataset.select_columns(kept)
        truncated = dataset.map(lambda row: {"input_ids": row["input_ids"][: spec.seq_len]})
        try:
            return truncated, _pad_token_id(load_tokenizer(spec.tokenizer))
        except DataError:
            return truncated, 0
    tokenizer = load_tokenizer(spec.tokenizer)

    def encode(batch: dict[str, list]) -> dict[str, list]:
        texts = [t if isinstance(t, str) else "" for t in batch[spec.text_column]]
        return tokenizer(texts, truncation=True, max_length=spec.seq_len)

    dropped = [c for c in dataset.column_names if c not in ("label", "labels")]
    return dataset.map(encode, batched=True, remove_columns=dropped), _pad_token_id(tokenizer)


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
            f"tokenizer={name}: cannot load it from {where}: {_first_line(exc)}; give a folder "
            "saved with save_pretrained"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def main(argv: list[str]) -> int:
    """`python -m autotune.user_data SPEC_JSON CACHE_DIR`: prints the entry's folder as JSON."""
    spec = DataSpec(**json.loads(argv[0]))
    try:
        folder = prepare(spec, Path(argv[1]))
    except DataError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    print(json.dumps({"folder": str(folder)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
