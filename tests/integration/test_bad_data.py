"""Data that would train as if it were right, or fail in every trial, is refused before the
first trial: one line naming the file and line or the column and row, exit code 2, no trial
run. Through the real command line and the real preparation subprocess."""

import json
import re
from pathlib import Path

import pytest

from autotune import cli
from tests.conftest import TINY_MODEL, fake_executor
from tests.text_data import write_corpus

TEXT = "the model trains fast on real text"


pytestmark = pytest.mark.usefixtures("probe_once")


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def refusal(tmp_path: Path, capsys, data: Path, tokenizer: Path) -> str:
    """The one line a search on `data` prints; its stand-in trials would all succeed."""
    out = tmp_path / "reports"
    code = cli.main(
        [
            "search",
            f"model={TINY_MODEL}",
            "seq_len=16",
            "n_trials=1",
            "study=s",
            f"out={out}",
            "confirm_rounds=0",
            f"data={data}",
            f"tokenizer={tokenizer}",
        ],
        executor=fake_executor("ok"),
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (out / "s" / "trials").exists(), "no trial ran"
    return " ".join(err.split())  # the console wraps long lines at its width


@pytest.mark.parametrize(
    ("value", "found"),
    [
        (["a list", "of strings"], "holds a value of type list"),
        (5, "holds a value of type int (5)"),
        (None, "holds null (no value)"),
    ],
)
def test_a_text_column_of_lists_numbers_or_nulls_is_refused_naming_column_row_and_type(
    corpus, tmp_path, capsys, value, found
):
    _, tokenizer = corpus
    rows = [{"text": TEXT, "label": 0}] * 3 + [{"text": value, "label": 1}]
    says = refusal(tmp_path, capsys, jsonl(tmp_path / "bad.jsonl", rows), tokenizer)
    assert "text_column=text: row 4 (counting from 1)" in says and found in says


def test_a_file_whose_texts_are_all_empty_is_refused(corpus, tmp_path, capsys):
    _, tokenizer = corpus
    data = jsonl(tmp_path / "empty.jsonl", [{"text": "", "label": 0}, {"text": " "}] * 5)
    assert "every text in data=" in refusal(tmp_path, capsys, data, tokenizer)


def test_samples_of_special_tokens_only_are_refused(corpus, tmp_path, capsys):
    """Characters the tokenizer does not know: every sample is [CLS] [UNK] [SEP]."""
    _, tokenizer = corpus
    data = jsonl(tmp_path / "unknown.jsonl", [{"text": "\u2603 \u2603"}] * 20)
    says = refusal(tmp_path, capsys, data, tokenizer)
    assert "100% of its 20 samples hold no token but special ones" in says


def test_a_string_label_column_is_refused_before_the_first_trial(corpus, tmp_path, capsys):
    _, tokenizer = corpus
    data = jsonl(tmp_path / "labels.jsonl", [{"text": TEXT, "label": "positive"}] * 3)
    says = refusal(tmp_path, capsys, data, tokenizer)
    assert (
        "row 1 (counting from 1) of the label column holds a value of type str ('positive')" in says
    )


@pytest.mark.parametrize(
    ("ids", "found"),
    [([5, -1], "holds a negative id"), ([], "holds no token ids (an empty list)")],
)
def test_negative_or_empty_input_ids_are_refused_before_the_first_trial(
    corpus, tmp_path, capsys, ids, found
):
    _, tokenizer = corpus
    rows = [{"input_ids": [5, 6, 7]}] * 2 + [{"input_ids": ids}]
    says = refusal(tmp_path, capsys, jsonl(tmp_path / "ids.jsonl", rows), tokenizer)
    assert "row 3 (counting from 1) of the input_ids column" in says and found in says


def test_a_byte_that_is_not_utf8_is_one_line_naming_file_and_line(corpus, tmp_path, capsys):
    _, tokenizer = corpus
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(b'{"text": "the model"}\n{"text": "caf\xe9"}\n')
    says = refusal(tmp_path, capsys, data, tokenizer)
    assert f"line 2 of {data} is not UTF-8 (byte 0xe9" in says


def test_a_malformed_line_in_the_middle_is_one_line_naming_it(corpus, tmp_path, capsys):
    _, tokenizer = corpus
    data = tmp_path / "broken.jsonl"
    data.write_text('{"text": "the model"}\n{"text": "the model"\n{"text": "the model"}\n')
    assert f"line 2 of {data} is not JSON" in refusal(tmp_path, capsys, data, tokenizer)


def test_an_empty_file_is_one_line_naming_it(corpus, tmp_path, capsys):
    _, tokenizer = corpus
    data = tmp_path / "empty.jsonl"
    data.write_bytes(b"")
    assert f"{data} is empty" in refusal(tmp_path, capsys, data, tokenizer)


def test_when_every_trial_fails_the_same_way_the_exit_3_message_says_why_not_the_budget(
    tmp_path, capsys
):
    code = cli.main(
        [
            "search",
            f"model={TINY_MODEL}",
            "seq_len=16",
            "n_trials=2",
            "study=s",
            f"out={tmp_path}",
            "confirm_rounds=0",
        ],
        executor=fake_executor("error"),
    )
    out = " ".join(capsys.readouterr().out.split())
    assert code == 3
    assert "every trial that ran ended error (ValueError: bad things)" in out
    assert "trials/0000/worker.log in the study folder" in out
    assert "budget" not in out.split("baseline (HF defaults)")[-1]


def test_the_data_changed_refusal_says_which_setting_changed_not_two_dicts(
    corpus, tmp_path, capsys
):
    _, tokenizer = corpus
    data = write_corpus(tmp_path / "train.jsonl")

    def search(*extra: str) -> int:
        return cli.main(
            [
                "search",
                f"model={TINY_MODEL}",
                "n_trials=1",
                "study=s",
                f"out={tmp_path}",
                f"data={data}",
                f"tokenizer={tokenizer}",
                *extra,
            ],
            executor=fake_executor("ok"),
        )

    assert search("seq_len=16") == 0
    before = json.loads((tmp_path / "s" / "recommended.json").read_text())
    capsys.readouterr()
    write_corpus(data, seed=1)  # the same file, other text
    assert search("seq_len=16") == 2
    says = " ".join(capsys.readouterr().err.split())
    assert re.search(r"data_fingerprint [0-9a-f]{16} -> [0-9a-f]{16}", says), says
    assert "{" not in says
    assert json.loads((tmp_path / "s" / "recommended.json").read_text()) == before
