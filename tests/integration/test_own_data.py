"""Searches on the user's own data (`data=`) and with the user's own Trainer (`trainer=`), run
as the "Your own data" and "Your own Trainer" sections of docs/own-data.md show them."""

import csv
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune import cli
from autotune.common.layout import DATA_CACHE
from autotune.common.trial import Status
from autotune.common.user_data import READY
from autotune.store.records import load_records
from tests.benchmarking import up_to_three_attempts
from tests.conftest import fake_executor
from tests.docs_text import page
from tests.text_data import write_corpus

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "classifier_trainer.py"


def documented_command(section: str) -> list[str]:
    """The `autotune search` line of a section of docs/own-data.md, split as a shell would."""
    text = page("own-data.md").split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)```", text, flags=re.S)[0]
    return shlex.split(block.strip())


def autotune(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=cwd,
    )


def run_exported_script(study_dir: Path, output_dir: Path) -> subprocess.CompletedProcess:
    """The study's recommended.py for 3 steps: it must train (its Trainer reports a loss)."""
    proc = subprocess.run(
        [
            sys.executable,
            str(study_dir / "recommended.py"),
            "--max-steps",
            "3",
            "--output-dir",
            str(output_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'train_loss'" in proc.stdout + proc.stderr
    return proc


def study_of(folder: Path) -> optuna.Study:
    return optuna.load_study(study_name=folder.name, storage=f"sqlite:///{folder / 'study.db'}")


def test_a_search_on_the_users_data_measures_padding_and_reuses_its_tokens(corpus, tmp_path):
    data, tokenizer = corpus
    command = documented_command("Your own data")
    assert command[:2] == ["autotune", "search"] and "space=data" in command
    # The documented search on the shipped examples, here on the corpus (and its tokenizer) whose
    # lengths the test knows, with the test's own trial count.
    swap = {"data": str(data), "tokenizer": str(tokenizer)}
    command = [
        f"{key}{sep}{swap.get(key, value)}"
        for key, sep, value in (a.partition("=") for a in command[1:])
        if key != "n_trials"
    ]
    fast = [
        "n_trials=6",
        "warmup_steps=1",
        "measure_steps=4",
        f"out={tmp_path}",
        "study=own",
        "confirm_rounds=0",
        "early_stop=false",  # every trial measures its padding (a busy machine stopped some)
    ]
    proc = autotune(*command, *fast)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = load_records(study_of(tmp_path / "own"))
    ok = [r for r in records if r.status is Status.OK]
    assert len(records) == 6 and len(ok) >= 5, [(r.number, r.result.reason) for r in records]
    for knob in ("dataloader_num_workers", "pad_to_multiple_of", "group_by_length"):
        assert len({r.params[knob] for r in records}) > 1, f"the trials vary {knob}"
    lengths = [min(n + 2, 128) for n in _word_counts(data)]  # a token per word, [CLS], [SEP]
    for r in ok:
        tokens_per_sample = r.result.tokens_per_s / r.result.samples_per_s
        # Real tokens only: about the data's mean length (the timed batches are a sample of
        # it), far below the padded length a batch computes on.
        assert 0.5 * _mean(lengths) < tokens_per_sample < 1.5 * _mean(lengths)
        assert 0 < r.result.padding_share < 1
    no_grouping = [r for r in ok if not r.params["group_by_length"]]
    assert all(r.result.padding_share > 0.2 for r in no_grouping), "random batches pad a lot"
    with open(tmp_path / "own" / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert all(row["padding_share"] for row in rows if row["status"] == "ok")

    # Tokenized once: the resumed study reads the same entry, untouched.
    entries = list((tmp_path / "own" / DATA_CACHE).iterdir())
    assert len(entries) == 1 and json.loads((entries[0] / READY).read_text())["rows"] == 300
    arrow = next(entries[0].glob("*.arrow"))
    stamp = arrow.stat().st_mtime_ns
    resumed = [*command, *fast[1:], "n_trials=7"]
    proc = autotune(*resumed)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resuming: 6 finished trial(s) kept" in proc.stdout
    assert list((tmp_path / "own" / DATA_CACHE).iterdir()) == entries
    assert arrow.stat().st_mtime_ns == stamp, "no second tokenization"

    # Other data is another study: resuming with it is refused, before any trial runs.
    changed = write_corpus(tmp_path / "changed.jsonl", seed=3)
    other = [a.replace(str(data), str(changed)) for a in resumed]
    proc = autotune(*other)
    assert proc.returncode == 2 and "data_fingerprint" in proc.stderr, proc.stderr
    assert len(load_records(study_of(tmp_path / "own"))) == 7

    # The exported script trains on the same data with the recommended settings.
    run_exported_script(tmp_path / "own", tmp_path / "run")


def _word_counts(path: Path) -> list[int]:
    return [len(json.loads(line)["text"].split()) for line in path.read_text().splitlines()]


def _mean(values: list[int]) -> float:
    return sum(values) / len(values)


def test_a_tokenizer_that_cannot_be_had_offline_is_exit_2_with_nothing_run(corpus, tmp_path):
    """No tokenizer=: the model's name, a hub id, which an offline machine cannot load."""
    data, _ = corpus
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune",
            "search",
            "model=google/bert_uncased_L-2_H-128_A-2",
            f"data={data}",
            f"out={tmp_path}",
            "study=s",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 2
    assert "tokenizer=google/bert_uncased_L-2_H-128_A-2: cannot load it from the hub" in (
        proc.stderr
    ), proc.stderr
    assert not (tmp_path / "s" / "study.db").exists()


def test_the_users_trainer_is_what_each_trial_times(tmp_path, capsys):
    command = [c for c in documented_command("Your own Trainer") if not c.startswith("n_trials=")]
    assert command[:2] == ["autotune", "search"]
    fast = [
        "n_trials=4",
        "seq_len=128",
        "warmup_steps=1",
        "measure_steps=3",
        "confirm_rounds=0",
        "early_stop=false",  # every trial ends ok, also on a busy machine
        f"out={tmp_path}",
        "study=mine",
    ]
    proc = autotune(*command[1:], *fast, cwd=ROOT)  # the documented path is the repo's
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = load_records(study_of(tmp_path / "mine"))
    assert len(records) == 4 and all(r.status is Status.OK for r in records), records
    for r in records:
        log = (tmp_path / "mine" / "trials" / f"{r.number:04d}" / "worker.log").read_text()
        assert "classifier_trainer: building the example's own Trainer" in log
        assert r.result.padding_share > 0, "the factory's collator pads per batch"
    assert all("pad_to_multiple_of" not in r.params for r in records)
    # What the factory trains (a 2-layer BERT of its own on short reviews), not seq_len=128.
    assert all(r.result.trained_model == "bert" for r in records)
    assert all(0 < r.result.trained_seq_len < 128 for r in records)
    assert "note: the factory trains bert on batches of up to" in proc.stdout

    # Confirming and verifying import the factory the study's database names: each says which
    # file it runs, with its sha256 (the one the search checked), before it does.
    sha = hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    for again, then in (
        (["confirm", "rounds=1"], "confirming:"),
        (["verify", "steps=4"], "verified:"),
    ):
        # The stand-in worker runs their trials: the factory's own trials ran above.
        capsys.readouterr()
        code = cli.main(
            [again[0], str(tmp_path / "mine"), *again[1:]], executor=fake_executor("ok")
        )
        out = capsys.readouterr().out
        assert code == 0, out[-3000:]
        said = f"trainer={EXAMPLE}:make_trainer: runs {EXAMPLE} (sha256 {sha})"
        assert said in out and out.index(said) < out.index(then)
    # `autotune report` prints what the verify found, under the recommendation, as the
    # report's page does.
    assert cli.main(["report", str(tmp_path / "mine")]) == 0
    out = capsys.readouterr().out
    assert "  verified: trial " in out and " over 4 steps: " in out, out[-3000:]

    script = (tmp_path / "mine" / "recommended.py").read_text()
    assert f"'factory': '{EXAMPLE}:make_trainer'" in script
    proc = run_exported_script(tmp_path / "mine", tmp_path / "run")
    assert "classifier_trainer: building the example's own Trainer" in proc.stdout


def test_a_factory_with_a_wrong_signature_stops_the_search_and_one_that_raises_fails_trials(
    tmp_path,
):
    factory = tmp_path / "factories.py"
    factory.write_text(
        "def two_args(args):\n    return None\n\n"
        "def raises(args, model_kwargs):\n    raise ValueError('the user factory broke')\n"
    )
    base = ["search", "model=google/bert_uncased_L-2_H-128_A-2", f"out={tmp_path}"]
    proc = autotune(*base, f"trainer={factory}:two_args", "study=sig")
    assert proc.returncode == 2
    assert "cannot be called as two_args(args, model_kwargs)" in proc.stderr, proc.stderr
    assert not (tmp_path / "sig" / "study.db").exists(), "nothing was run"
    proc = autotune(*base, "trainer=no_such_module:make", "study=missing")
    assert proc.returncode == 2 and "importing no_such_module failed" in proc.stderr

    proc = autotune(
        *base,
        f"trainer={factory}:raises",
        "study=raises",
        "n_trials=2",
        "seq_len=32",
        "confirm_rounds=0",
    )
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = load_records(study_of(tmp_path / "raises"))
    assert [r.status for r in records] == [Status.ERROR, Status.ERROR]
    assert "ValueError: the user factory broke" in records[0].result.reason
    assert "factories.py" in records[0].result.stderr_tail, "the user's traceback is kept"


HEAVY_FACTORY = """
import hashlib

import datasets
import transformers

ROWS = 256


def heavy(batch):
    # Real work per sample, as image decoding or on-the-fly tokenization would be: ~20 ms here.
    ids = []
    for text in batch["text"]:
        digest = text.encode()
        for _ in range(40000):
            digest = hashlib.sha256(digest).digest()
        ids.append([2 + b % 200 for b in digest] * 2)
    return {"input_ids": ids, "labels": [i % 2 for i in range(len(ids))]}


def make_trainer(args, model_kwargs):
    data = datasets.Dataset.from_dict({"text": [f"sample {i}" for i in range(ROWS)]})
    data.set_transform(heavy)
    config = transformers.BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=128)
    model = transformers.AutoModelForSequenceClassification.from_config(config, **model_kwargs)
    args.remove_unused_columns = False
    return transformers.Trainer(model=model, args=args, train_dataset=data)
"""
WORKERS_SPACE = """knobs:
  precision: fp32
  batch_size: 16
  grad_accum: 1
  optim: adamw_torch
  dataloader_num_workers: {choices: [0, 2]}
"""


@pytest.mark.benchmark
@up_to_three_attempts
def test_loader_workers_pay_off_when_the_data_costs_cpu_time(corpus, tmp_path):
    """With a CPU-heavy per-sample transform, 2 loader workers beat none by far; on data
    tokenized before the search they gain much less (their start-up falls in the untimed
    warm-up; what they take off the training process is reading and padding rows)."""
    (tmp_path / "heavy.py").write_text(HEAVY_FACTORY)
    (tmp_path / "workers.yaml").write_text(WORKERS_SPACE)
    base = [
        "search",
        "model=google/bert_uncased_L-2_H-128_A-2",
        "seq_len=64",
        "sampler=grid",
        "n_trials=3",
        f"space={tmp_path / 'workers.yaml'}",
        "warmup_steps=2",
        "measure_steps=5",
        f"out={tmp_path}",
        "confirm_rounds=0",
    ]
    data, tokenizer = corpus
    speeds = {}
    for name, source in (
        ("heavy", [f"trainer={tmp_path / 'heavy.py'}:make_trainer"]),
        ("tokenized", [f"data={data}", f"tokenizer={tokenizer}"]),
    ):
        proc = autotune(*base, *source, f"study={name}")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        records = load_records(study_of(tmp_path / name))
        speeds[name] = {
            r.params["dataloader_num_workers"]: r.result.samples_per_s
            for r in records
            if not r.baseline
        }
    heavy, tokenized = (speeds[k][2] / speeds[k][0] for k in ("heavy", "tokenized"))
    print(
        f"samples/s with 2 loader workers over none: heavy transform {heavy:.2f}, "
        f"tokenized data {tokenized:.2f}"
    )
    assert heavy > 1.3
    # On data tokenized before the search a worker has only rows to read and pad: what it
    # takes off the training process is small beside a transform's work.
    assert heavy > 1.3 * tokenized


def test_the_documented_recipe_makes_the_shipped_tokenizer_byte_for_byte(tmp_path):
    """docs/own-data.md says how examples/tokenizer was made: run that command in a copy of
    examples/, and the files it saves are the shipped ones."""
    import shutil

    found = re.search(
        r"`(python -c \"import json, sys;.*?\('examples/tokenizer'\)\")`", page("own-data.md")
    )
    recipe = found.group(1)
    shutil.copytree(
        ROOT / "examples",
        tmp_path / "examples",
        ignore=shutil.ignore_patterns("tokenizer", "__pycache__"),
    )
    made = subprocess.run(
        recipe, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert made.returncode == 0, made.stderr[-2000:]
    shipped = sorted(p.name for p in (ROOT / "examples/tokenizer").iterdir())
    assert sorted(p.name for p in (tmp_path / "examples/tokenizer").iterdir()) == shipped
    for name in shipped:
        assert (tmp_path / "examples/tokenizer" / name).read_bytes() == (
            ROOT / "examples/tokenizer" / name
        ).read_bytes(), name
