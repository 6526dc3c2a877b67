"""Padding on real text: samples/s and the padding share with and without length grouping and
a padding multiple of 8, and what a trial costs beyond training with `data=`.

Runs real searches (the grid over group_by_length x pad_to_multiple_of at batch 16, fp32, no
loader workers) on the tiny BERT, seq_len 128, over 300 lines of 3 to 120 words with a
WordPiece tokenizer trained on them (both made here, offline), REPEATS times; and one search
on synthetic tokens for the overhead compared. Every figure comes from the studies' trials.

    python benchmarks/padding.py [--repeats 3]

Writes benchmarks/results/padding.json and prints the table of docs/own-data.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import autotune  # noqa: E402
from tests.text_data import train_tokenizer, write_corpus  # noqa: E402

MODEL = "google/bert_uncased_L-2_H-128_A-2"
SPACE = """description: padding on real text
device: any
knobs:
  precision: fp32
  batch_size: 16
  grad_accum: 1
  optim: adamw_torch
  dataloader_num_workers: 0
  group_by_length: {choices: [false, true]}
  pad_to_multiple_of: {choices: [1, 8]}
"""
SYNTHETIC_SPACE = SPACE.split("  group_by_length")[0]


def search(folder: Path, name: str, **settings: object) -> list:
    result = autotune.search(
        MODEL, quiet=True, seq_len=128, sampler="grid", out=str(folder), study=name, **settings
    )
    return [t for t in result.trials if t.result.status.value == "ok"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    cli = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = write_corpus(folder / "train.jsonl")
        tokenizer = train_tokenizer(data, folder / "tokenizer")
        (folder / "padding.yaml").write_text(SPACE)
        (folder / "synthetic.yaml").write_text(SYNTHETIC_SPACE)
        rows: dict[tuple[bool, int], dict[str, list[float]]] = {}
        overhead: dict[str, list[float]] = {"data": [], "synthetic": []}
        for repeat in range(cli.repeats):
            trials = search(
                folder,
                f"padding-{repeat}",
                data=str(data),
                tokenizer=str(tokenizer),
                space=str(folder / "padding.yaml"),
                n_trials=5,
            )
            for t in trials:
                overhead["data"].append(t.result.wall_s - t.result.train_s)
                if t.number == 0:
                    continue  # the baseline: batch 8
                key = (t.params["group_by_length"], t.params["pad_to_multiple_of"])
                row = rows.setdefault(key, {"samples_per_s": [], "padding_share": []})
                row["samples_per_s"].append(t.result.samples_per_s)
                row["padding_share"].append(t.result.padding_share)
        synthetic = search(folder, "synthetic", space=str(folder / "synthetic.yaml"), n_trials=5)
        overhead["synthetic"] = [t.result.wall_s - t.result.train_s for t in synthetic]
    results = {
        "model": MODEL,
        "seq_len": 128,
        "batch_size": 16,
        "rows": [
            {"group_by_length": g, "pad_to_multiple_of": m, **figures}
            for (g, m), figures in sorted(rows.items())
        ],
        "overhead_s": overhead,
    }
    out = ROOT / "benchmarks" / "results" / "padding.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print("| group_by_length | pad_to_multiple_of | samples/s (median, min-max) | padding share |")
    print("|---|---|---|---|")
    for row in results["rows"]:
        speeds = row["samples_per_s"]
        print(
            f"| {str(row['group_by_length']).lower()} | {row['pad_to_multiple_of']} | "
            f"{statistics.median(speeds):.0f} ({min(speeds):.0f}-{max(speeds):.0f}) | "
            f"{statistics.median(row['padding_share']):.0%} |"
        )
    for kind, values in overhead.items():
        print(
            f"\ntime beyond training per trial, {kind}: median {statistics.median(values):.2f} s "
            f"({min(values):.2f}-{max(values):.2f}, {len(values)} trials)"
        )


if __name__ == "__main__":
    main()
