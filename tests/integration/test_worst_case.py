"""On data of many lengths a trial's peak covers the longest batch the run can meet: its last
warm-up step trains on the longest samples, whatever the few steps of a trial would have drawn."""

import csv
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.text_data import WORDS

pytestmark = pytest.mark.slow
MODEL = "google/bert_uncased_L-4_H-256_A-4"  # 4 blocks: activations outweigh the noise


def write_lines(path: Path, lengths: list[int]) -> Path:
    rng = random.Random(0)
    with open(path, "w") as f:
        for i, words in enumerate(lengths):
            f.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=words)), "label": i % 2}))
            f.write("\n")
    return path


def peak_and_longest(tmp_path: Path, name: str, data: Path, tokenizer: Path) -> tuple[float, int]:
    command = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        f"model={MODEL}",
        "seq_len=256",
        f"data={data}",
        f"tokenizer={tokenizer}",
        "n_trials=1",
        "warmup_steps=2",
        "measure_steps=2",
        "confirm_rounds=0",
        f"out={tmp_path}",
        f"study={name}",
    ]
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    with open(tmp_path / name / "trials.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert row["status"] == "ok", row
    return float(row["peak_memory_gib"]), int(row["trained_seq_len"])


def test_the_peak_covers_the_longest_batch_of_the_data(tmp_path, corpus):
    _, tokenizer = corpus
    rng = random.Random(1)
    # 1000 samples of 5-20 words, 8 of them 200: four steps of 8 random samples would most
    # likely meet none of the 8 (about a 1 in 4 chance to meet one).
    lengths = [rng.randint(5, 20) for _ in range(1000)]
    for i in rng.sample(range(1000), 8):
        lengths[i] = 200
    varied = peak_and_longest(
        tmp_path, "varied", write_lines(tmp_path / "v.jsonl", lengths), tokenizer
    )
    long = peak_and_longest(
        tmp_path, "long", write_lines(tmp_path / "l.jsonl", [200] * 64), tokenizer
    )
    few = [rng.randint(5, 20) for _ in range(64)]
    short = peak_and_longest(tmp_path, "short", write_lines(tmp_path / "s.jsonl", few), tokenizer)
    # trials.csv names the longest row the peak covered: 200 words and [CLS], [SEP].
    assert varied[1] == long[1] == 202 and short[1] <= 22
    print(
        f"\npeak GiB: varied {varied[0]:.3f}, every batch longest {long[0]:.3f}, "
        f"short only {short[0]:.3f}"
    )
    assert varied[0] == pytest.approx(long[0], abs=0.06)  # RSS: the allocator keeps some
    assert short[0] < varied[0] - 0.08
