"""The user's own data (`data=`) as both sides see it: `DataSpec` and its fingerprint, how its
format is told, and the layout of a prepared cache entry. The search fingerprints the data once
(part of the study's identity); `autotune.child.prepare_data` tokenizes it in a child process;
each trial reads the prepared entry.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from pathlib import Path
from typing import Any

from autotune.common.errors import DataError

BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet",
            ".txt": "text"}  # fmt: skip
"""File suffix -> the `datasets` builder that reads it."""


READY = "autotune-ready.json"
"""Written last into a cache entry: an entry without it is incomplete and is rebuilt."""


FORMAT_VERSION = 2
"""Of a cache entry: part of the fingerprint, so entries of an older layout are rebuilt."""


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
        """Hex digest of everything that decides the tokens: the files' names (relative) and
        bytes, or the hub id; the split, the column and seq_len. A dataset moved to another
        folder keeps its fingerprint."""
        settings = {
            "split": self.split,
            "text_column": self.text_column,
            "seq_len": self.seq_len,
            "format": FORMAT_VERSION,
        }
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
        for source in (self.data, self.tokenizer):
            root = Path(source)
            files = _files(root)
            digest.update(b"\0" + (b"" if files else source.encode()))  # a hub id: its name
            for path in files:
                digest.update(
                    path.relative_to(root).as_posix().encode()
                    if root.is_dir()
                    else path.name.encode()
                )
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


def read_ready(folder: Path) -> dict[str, Any]:
    """A complete entry's summary: rows, pad_token_id, max_token_id, spec."""
    return json.loads((folder / READY).read_text())


def source_format(data: str) -> tuple[str, list[str]]:
    """How `data=` is read: (`save_to_disk`, []), (`hub`, []), or (a `datasets` builder such
    as `json`, its files); a DataError when it cannot be told."""
    path = Path(data)
    if _is_saved_dataset(path):
        return "save_to_disk", []
    if path.exists():
        files = _files(path)
        kinds = {BUILDERS.get(p.suffix.lower()) for p in files}
        if not files or None in kinds or len(kinds) > 1:
            found = ", ".join(sorted({p.suffix or p.name for p in files})) or "no files"
            raise DataError(
                f"data={data}: cannot tell its format (found {found}); give "
                f"{', '.join(BUILDERS)} files of one kind, or a save_to_disk folder"
            )
        return str(kinds.pop()), [str(p) for p in files]
    if path.suffix.lower() in BUILDERS or data.startswith((".", "/", "~")):
        raise DataError(f"data={data}: no such file or folder{did_you_mean(path)}")
    return "hub", []


def did_you_mean(path: Path) -> str:
    """`; did you mean ./train.csv?`: the closest name in the folder the missing path names, of
    a file or folder the data could be; none when nothing is close (or the folder is gone)."""
    folder = path.expanduser().parent
    try:
        names = [p.name for p in folder.iterdir() if p.is_dir() or p.suffix.lower() in BUILDERS]
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return f"; did you mean {folder / close[0]}?" if close else ""
