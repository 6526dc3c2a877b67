"""The checks of the user's data, called on values and arrays directly (no files, no torch)."""

import re

import pyarrow as pa
import pytest

from autotune.child.data_checks import (
    DataError,
    check_files,
    check_labels,
    check_prompt_completion,
    check_real_tokens,
    check_texts,
    check_token_ids,
    check_turns,
    first_bad_json_line,
)


@pytest.mark.parametrize(
    ("value", "found"),
    [
        (["a", "b"], "a value of type list"),
        (3.5, "a value of type float (3.5)"),
        (None, "null (no value)"),
    ],
)
def test_a_text_that_is_not_a_string_is_refused_naming_column_row_and_type(value, found):
    with pytest.raises(
        DataError, match=rf"text_column=body: row 2 \(counting from 1\).*{re.escape(found)}"
    ):
        check_texts("d.jsonl", "body", ["fine", value, "fine"])


def test_texts_that_are_all_blank_are_refused_and_one_real_text_is_enough():
    with pytest.raises(DataError, match=r"every text in data=d\.jsonl is empty"):
        check_texts("d.jsonl", "text", ["", "  ", "\n"])
    check_texts("d.jsonl", "text", ["", "a word", ""])


def test_a_label_that_is_not_a_class_id_is_refused_naming_row():
    check_labels("d", "label", [0, 1, True, 2.0])
    for bad in ("pos", None, 0.5):
        with pytest.raises(DataError, match=r"row 3 \(counting from 1\) of the label column"):
            check_labels("d", "label", [0, 1, bad])


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ([[1, 2], [3, -4]], r"row 2 .* holds a negative id"),
        ([[1, 2], []], r"row 2 .* holds no token ids"),
        ([[1, 2], None], r"row 2 .* holds null"),
        ([[1], [2, None]], r"row 2 .* holds a missing id"),
        ([["a"], ["b"]], r"input_ids column holds list<item: string>"),
    ],
)
def test_negative_empty_or_missing_token_ids_are_refused_naming_row(rows, says):
    with pytest.raises(DataError, match=says):
        check_token_ids("d", pa.chunked_array([pa.array(rows)]))


def test_token_ids_of_every_row_pass():
    check_token_ids("d", pa.chunked_array([pa.array([[0, 1]]), pa.array([[5]])]))


def test_samples_that_are_nearly_all_special_tokens_are_refused():
    specials = [101, 102, 100]
    only_special = [[101, 100, 102]] * 19 + [[101, 7, 102]]
    with pytest.raises(DataError, match="95% of its 20 samples hold no token but special"):
        check_real_tokens("d", pa.array(only_special), specials)
    check_real_tokens("d", pa.array([[101, 102]] * 17 + [[101, 7, 102]] * 3), specials)


def test_an_empty_or_non_utf8_file_is_refused_naming_file_and_line(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=f"{empty} is empty"):
        check_files("d", "json", [str(empty)])
    latin = tmp_path / "l.csv"
    latin.write_bytes(b"text\nok\ncaf\xe9\n")
    with pytest.raises(DataError, match=rf"line 3 of {latin} is not UTF-8 \(byte 0xe9 at column 4"):
        check_files("d", "csv", [str(latin)])
    check_files("d", "parquet", [str(latin)])  # a binary format: its bytes are not text


def test_the_first_malformed_json_line_is_named(tmp_path):
    lines = tmp_path / "a.jsonl"
    lines.write_text('{"text": "a"}\n\n{"text": "b"\n{"text": "c"}\n')
    assert (
        first_bad_json_line([str(lines)])
        == f"line 3 of {lines} is not JSON (Expecting ',' delimiter)"
    )
    document = tmp_path / "b.json"
    document.write_text('[\n{"text": "a"},\n{"text": "b"}\n]\n')
    assert first_bad_json_line([str(document)]) is None


USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("turns", "says"),
    [
        ([], "holds no turns"),
        ("hi", "holds a value of type str"),
        ([USER, "hi"], "has turn 2 of a value of type str"),
        ([{"role": "user"}], "has turn 1 whose content is none, not text"),
        ([{"role": 1, "content": "hi"}], "has turn 1 whose role is a value of type int"),
    ],
)
def test_chat_turns_without_a_role_and_its_text_are_refused_naming_row_and_turn(turns, says):
    with pytest.raises(
        DataError, match=rf"row 2 \(counting from 1\) of the messages column {says}"
    ):
        check_turns("chat.jsonl", "messages", [[USER], turns])


def test_chat_turns_each_with_a_role_and_text_pass():
    check_turns("chat.jsonl", "messages", [[USER, {"role": "assistant", "content": ""}]])


def test_a_prompt_and_completion_must_both_be_text_or_both_turns():
    check_prompt_completion("d.jsonl", [("a", "b"), ([USER], [USER])])
    with pytest.raises(DataError, match=r"row 1 .* a prompt of turns and a completion of a value"):
        check_prompt_completion("d.jsonl", [([USER], "b")])
    with pytest.raises(DataError, match=r"row 2 .* a completion of null"):
        check_prompt_completion("d.jsonl", [("a", "b"), ("a", None)])
    with pytest.raises(DataError, match=r"row 1 .* of the completion column holds no turns"):
        check_prompt_completion("d.jsonl", [([USER], [])])
