"""Checks of the user's data (`data=`) before the first trial: a value a trial would train on
as if it were right (a list tokenized as "", a sample of special tokens only) or fail on in
every trial (a string label, a negative token id) is refused here, naming the file and line or
the column and row, so that the search never starts on it.

Rows are counted from 1 (a .jsonl file's line when it has no blank lines); lines too. Pure:
the columns come as Python values or pyarrow arrays, so these run without torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from autotune.common.errors import DataError

TEXT_BUILDERS = ("json", "csv", "text")
"""`datasets` builders that read text files: their bytes must be UTF-8."""
MOSTLY_SPECIAL_SHARE = 0.9
"""Past this share of samples holding special tokens only ([CLS] [SEP], [UNK]), the data is
refused: such samples train nothing and are short, so samples/s would be far too good."""


def check_files(data: str, builder: str, files: list[str]) -> None:
    """Each file has bytes, and those of a text format are UTF-8 (pyarrow keeps a bad byte in
    a string column, and tokenizing it then fails with a traceback)."""
    for name in files:
        path = Path(name)
        if path.stat().st_size == 0:
            raise DataError(f"data={data}: {path} is empty; remove it or give it rows")
        if builder not in TEXT_BUILDERS:
            continue
        with open(path, "rb") as f:
            for line_number, line in enumerate(f, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(
                        f"data={data}: line {line_number} of {path} is not UTF-8 (byte "
                        f"0x{line[exc.start]:02x} at column {exc.start + 1}); save the file as "
                        "UTF-8"
                    ) from exc


def first_bad_json_line(files: list[str]) -> str | None:
    """Where a JSON file `datasets` could not read breaks: "line N of FILE: why", or None
    when every file reads (a single JSON document, or JSON lines)."""
    for name in files:
        text = Path(name).read_text(encoding="utf-8")
        try:
            json.loads(text)
            continue  # one JSON document: not a JSON lines problem
        except json.JSONDecodeError:
            pass
        for line_number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                json.loads(line)
            except json.JSONDecodeError as exc:
                return f"line {line_number} of {name} is not JSON ({exc.msg})"
    return None


def check_texts(data: str, column: str, values: Iterable[Any]) -> None:
    """Every value of the text column is a string, and not all are blank."""
    blank = True
    for row, value in enumerate(values, 1):
        if not isinstance(value, str):
            found = "null (no value)" if value is None else _typed(value)
            raise DataError(
                f"text_column={column}: row {row} (counting from 1) of data={data} holds "
                f"{found}, not text; every value of the text column must be a string (join a "
                "list of strings into one, drop rows without text)"
            )
        blank = blank and not value.strip()
    if blank:
        raise DataError(
            f"text_column={column}: every text in data={data} is empty; name the column that "
            "holds the text"
        )


def check_turns(data: str, column: str, values: Iterable[Any]) -> None:
    """Every value of a chat column is a list of turns, each a role and its text, as a chat
    template reads them."""
    for row, turns in enumerate(values, 1):
        problem = _turns_problem(turns)
        if problem:
            raise DataError(
                f"data={data}: row {row} (counting from 1) of the {column} column {problem}; "
                'each row must be a list of turns like {"role": "user", "content": "..."}'
            )


def _turns_problem(turns: Any) -> str | None:
    if not isinstance(turns, list) or not turns:
        return "holds no turns" if not turns else f"holds {_typed(turns)}"
    for number, turn in enumerate(turns, 1):
        if not isinstance(turn, dict):
            return f"has turn {number} of {_typed(turn)}"
        for key in ("role", "content"):
            if not isinstance(turn.get(key), str):
                found = "none" if turn.get(key) is None else _typed(turn[key])
                return f"has turn {number} whose {key} is {found}, not text"
    return None


def check_prompt_completion(data: str, pairs: Iterable[tuple[Any, Any]]) -> None:
    """Every prompt and its completion are both text, or both lists of chat turns."""
    for row, (prompt, completion) in enumerate(pairs, 1):
        if isinstance(prompt, str) and isinstance(completion, str):
            continue
        where = f"data={data}: row {row} (counting from 1)"
        if isinstance(prompt, list) and isinstance(completion, list):
            for column, turns in (("prompt", prompt), ("completion", completion)):
                problem = _turns_problem(turns)
                if problem:
                    raise DataError(
                        f"{where} of the {column} column {problem}; each turn is like "
                        '{"role": "user", "content": "..."}'
                    )
            continue
        found = [
            "null (no value)" if v is None else "turns" if isinstance(v, list) else _typed(v)
            for v in (prompt, completion)
        ]
        raise DataError(
            f"{where} has a prompt of {found[0]} and a completion of {found[1]}; give both "
            "as text, or both as lists of chat turns"
        )


def _typed(value: Any) -> str:
    """A value as a message shows it: its type and the start of its text."""
    return f"a value of type {type(value).__name__} ({value!r:.40})"


def check_labels(data: str, column: str, values: Iterable[Any]) -> None:
    """Every label is a whole number (a class id), as the classification head needs."""
    for row, value in enumerate(values, 1):
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if not whole:
            found = "null (no value)" if value is None else _typed(value)
            raise DataError(
                f"data={data}: row {row} (counting from 1) of the {column} column holds "
                f"{found}; labels must be class ids 0, 1, ...: map the label names to ids, "
                f"or drop the {column} column"
            )


def check_token_ids(data: str, column: Any) -> None:
    """`input_ids` (a pyarrow list column) holds, in every row, at least one id, none negative
    and none missing."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) or not (
        pa.types.is_integer(column.type.value_type) or pa.types.is_null(column.type.value_type)
    ):
        raise DataError(
            f"data={data}: its input_ids column holds {column.type}, not lists of token ids "
            "(integers); give lists of integers, or text in a text column"
        )
    problems = (
        (pc.is_null(column), "null (no value)"),
        (pc.equal(pc.list_value_length(column.fill_null([])), 0), "no token ids (an empty list)"),
    )
    for mask, found in problems:
        _refuse_row(data, mask, f"holds {found}")
    flat = pc.list_flatten(column)
    parents = pc.list_parent_indices(column)
    for mask, found in ((pc.is_null(flat), "a missing id"), (pc.less(flat, 0), "a negative id")):
        index = pc.index(mask.fill_null(False), True).as_py()
        if index >= 0:
            row = parents[index].as_py() + 1
            raise DataError(
                f"data={data}: row {row} (counting from 1) of the input_ids column holds "
                f"{found} ({column[row - 1].as_py()[:8]}...); token ids are 0 or more"
            )


def _refuse_row(data: str, mask: Any, what: str) -> None:
    import pyarrow.compute as pc

    index = pc.index(mask.fill_null(False), True).as_py()
    if index >= 0:
        raise DataError(
            f"data={data}: row {index + 1} (counting from 1) of the input_ids column {what}; "
            "every sample needs token ids"
        )


def check_real_tokens(data: str, input_ids: Any, special_ids: Iterable[int]) -> None:
    """Refuses tokenized text whose samples nearly all hold special tokens only."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = len(input_ids)
    flat = pc.list_flatten(input_ids)
    real = pc.invert(pc.is_in(flat, value_set=pa.array(sorted(set(special_ids)), flat.type)))
    parents = pc.filter(pc.list_parent_indices(input_ids), real)
    share = 1 - len(pc.unique(parents)) / rows if rows else 0.0
    if share > MOSTLY_SPECIAL_SHARE:
        raise DataError(
            f"data={data}: {share:.0%} of its {rows} samples hold no token but special ones "
            "([CLS], [SEP], [UNK] ...) once tokenized: the texts are blank, or the tokenizer "
            "does not know their characters; give the text column and the model's tokenizer"
        )
