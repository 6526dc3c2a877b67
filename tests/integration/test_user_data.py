"""The user's own data (`data=`), prepared as a trial will read it: loaded with `datasets`,
tokenized once with the user's tokenizer (made offline here), cached by fingerprint."""

import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from autotune.child.prepare_data import prepare
from autotune.common.errors import DataError
from autotune.common.user_data import READY, DataSpec
from tests.text_data import write_corpus


def test_text_is_tokenized_once_truncated_and_cached(corpus, tmp_path):
    data, tokenizer = corpus
    spec = DataSpec(data=str(data), tokenizer=str(tokenizer), seq_len=64)
    folder = prepare(spec, tmp_path / "cache")
    dataset = datasets.load_from_disk(str(folder))
    assert len(dataset) == 300
    assert set(dataset.column_names) == {"input_ids", "attention_mask", "label", "length"}
    assert dataset["length"] == [len(ids) for ids in dataset["input_ids"]]
    lengths = [len(ids) for ids in dataset["input_ids"]]
    assert max(lengths) == 64 and min(lengths) < 20, "varied lengths, truncated at seq_len"
    summary = json.loads((folder / READY).read_text())
    assert summary["rows"] == 300 and summary["pad_token_id"] == 0  # [PAD] is the first token
    stamp = (folder / "data-00000-of-00001.arrow").stat().st_mtime_ns
    assert prepare(spec, tmp_path / "cache") == folder  # a lookup, not a second tokenization
    assert (folder / "data-00000-of-00001.arrow").stat().st_mtime_ns == stamp
    longer = prepare(
        DataSpec(data=str(data), tokenizer=str(tokenizer), seq_len=128), tmp_path / "cache"
    )
    assert longer != folder, "another seq_len is other tokens"


def test_changed_data_is_another_cache_entry(corpus, tmp_path):
    _, tokenizer = corpus
    copy = write_corpus(tmp_path / "train.jsonl")
    spec = DataSpec(data=str(copy), tokenizer=str(tokenizer), seq_len=64)
    first = spec.fingerprint()
    assert first == DataSpec(data=str(copy), tokenizer=str(tokenizer), seq_len=64).fingerprint()
    write_corpus(copy, seed=1)
    assert spec.fingerprint() != first


def test_each_problem_with_the_data_is_named(corpus, tmp_path):
    data, tokenizer = corpus
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.csv").write_text("text\nhello\n")
    (mixed / "b.bin").write_bytes(b"\0")
    (tmp_path / "nothing").mkdir()
    given = {"data": str(data), "tokenizer": str(tokenizer), "seq_len": 8}
    cases = [
        ({"data": str(tmp_path / "missing.jsonl")}, "no such file or folder"),
        ({"data": str(mixed)}, r"cannot tell its format \(found .bin, .csv\)"),
        ({"text_column": "body"}, r"text_column=body: .* no such column \(it has: text, label\)"),
        ({"split": "test"}, r"data_split=test: .* has the splits train"),
        ({"tokenizer": str(tmp_path / "nothing")}, r"nothing: cannot load it from that folder"),
    ]
    for changed, message in cases:
        with pytest.raises(DataError, match=message):
            prepare(DataSpec(**given | changed), tmp_path / "cache")


def test_the_search_prepares_data_in_a_subprocess(corpus, tmp_path):
    """The parent never imports transformers (it imports torch):
    `python -m autotune.child.prepare_data` prepares, and says where the entry is or what is
    wrong, as JSON."""
    data, tokenizer = corpus
    spec = {"data": str(data), "tokenizer": str(tokenizer), "seq_len": 32}
    command = [sys.executable, "-m", "autotune.child.prepare_data"]
    proc = subprocess.run(
        [*command, json.dumps(spec), str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["folder"].startswith(str(tmp_path))
    spec["text_column"] = "body"
    proc = subprocess.run(
        [*command, json.dumps(spec), str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert "text_column=body" in json.loads(proc.stdout.splitlines()[-1])["error"]


def test_a_second_preparation_racing_the_first_leaves_its_entry_alone(
    corpus, tmp_path, monkeypatch
):
    """Two processes prepare the same data: the later one looked before the first finished,
    so it builds too, but it leaves the finished entry in place (trials may be reading it)."""
    data, tokenizer = corpus
    spec = DataSpec(data=str(data), tokenizer=str(tokenizer), seq_len=16)
    folder = prepare(spec, tmp_path)
    stamp = (folder / READY).stat().st_mtime_ns
    real_is_file = Path.is_file
    looks = []

    def first_look_misses(path: Path) -> bool:  # the later process's first look: not there yet
        if path.name == READY:
            looks.append(path)
            if len(looks) == 1:
                return False
        return real_is_file(path)

    monkeypatch.setattr(Path, "is_file", first_look_misses)
    assert prepare(spec, tmp_path) == folder
    monkeypatch.undo()
    assert (folder / READY).stat().st_mtime_ns == stamp, "the finished entry was kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name], "no build left behind"


def test_preparing_writes_nothing_outside_the_study_s_cache(corpus, tmp_path, monkeypatch):
    """`datasets` writes a local file's Arrow copy into the HF datasets cache in the user's
    home, and a step's cache file beside the files of a `save_to_disk` folder, the user's
    own data. Both go to a scratch folder in the study's cache, removed once it is ready."""
    data, tokenizer = corpus
    home_cache = tmp_path / "hf-datasets"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home_cache)
    saved = tmp_path / "saved"
    datasets.load_dataset("json", data_files=str(data), cache_dir=str(tmp_path / "making"))[
        "train"
    ].save_to_disk(str(saved))
    given = sorted(p.name for p in saved.iterdir())
    for source in (data, saved):
        cache = tmp_path / f"cache-{source.name}"
        folder = prepare(DataSpec(data=str(source), tokenizer=str(tokenizer), seq_len=32), cache)
        assert [p.name for p in cache.iterdir()] == [folder.name], "no scratch left behind"
        assert len(datasets.load_from_disk(str(folder))) == 300
    assert sorted(p.name for p in saved.iterdir()) == given, "the user's folder was written"
    assert not home_cache.exists(), "the HF datasets cache was written"


def test_data_that_cannot_be_used_leaves_no_folder_of_its_making(tmp_path):
    """A new study's folder does not exist yet when its data is prepared: a refusal leaves
    none behind."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "one row"}\n{not json\n')
    cache = tmp_path / "out" / "study" / "data"
    with pytest.raises(DataError):
        prepare(DataSpec(data=str(bad), tokenizer="unused", seq_len=16), cache)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
