"""Chat data as users have it, on a LoRA job: a `messages` column rendered by the tokenizer's
chat template, `prompt`/`completion` rows trained on the completion alone, and TRL's
SFTTrainer as the user's Trainer (`examples/sft_trainer.py`), its adapter read and its model
estimated. Real worker processes, the chat example's data and tokenizer (`examples/`)."""

import json
from pathlib import Path

import datasets
import pytest
import transformers

from autotune.child.prepare_data import prepare
from autotune.child.rows import COMPLETION_MASK
from autotune.common.layout import DATA_CACHE
from autotune.common.models import resolve_model
from autotune.common.trial import Status, TrialSpec
from autotune.common.user_data import DataSpec
from autotune.execute.launchers import ForkserverLauncher
from autotune.execute.local import launch_trial
from autotune.plan.estimate import estimate
from autotune.plan.factory_model import factory_model
from autotune.store.records import load_records
from tests.integration.test_own_data import autotune, run_exported_script, study_of

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
FAST = ["n_trials=3", "warmup_steps=1", "measure_steps=3", "confirm_rounds=0",
        "early_stop=false"]  # fmt: skip


def test_a_lora_search_on_chat_turns_trains_them_as_the_chat_template_renders_them(tmp_path):
    proc = autotune("search", "model=examples/tiny-llama", "peft=lora", "seq_len=128",
                    "data=examples/chat.jsonl", "tokenizer=examples/chat-tokenizer", *FAST,
                    f"out={tmp_path}", "study=chat", cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = load_records(study_of(tmp_path / "chat"))
    assert [r.status for r in records] == [Status.OK] * 3
    assert all(r.result.padding_share > 0 for r in records), "turns of many lengths"
    (entry,) = (tmp_path / "chat" / DATA_CACHE).iterdir()
    rows = datasets.load_from_disk(str(entry))
    tokenizer = transformers.AutoTokenizer.from_pretrained(EXAMPLES / "chat-tokenizer")
    first = json.loads((EXAMPLES / "chat.jsonl").read_text().splitlines()[0])["messages"]
    rendered = tokenizer.apply_chat_template(first, tokenize=False)
    expected = tokenizer(rendered, add_special_tokens=False, truncation=True, max_length=128)
    assert rows[0]["input_ids"] == expected["input_ids"]
    assert tokenizer.convert_ids_to_tokens(rows[0]["input_ids"])[:2] == ["<s>", "<|user|>"]
    # The script tokenizes the turns as the trials had them, and trains on them.
    run_exported_script(tmp_path / "chat", tmp_path / "run")


def test_a_tokenizer_without_a_chat_template_is_exit_2_with_nothing_run(tmp_path):
    proc = autotune("search", "model=examples/tiny-llama", "peft=lora",
                    "data=examples/chat.jsonl", "tokenizer=examples/tokenizer",
                    f"out={tmp_path}", "study=chat", cwd=ROOT)  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "examples/tokenizer: it has no chat template" in " ".join(proc.stderr.split())
    assert not (tmp_path / "chat" / "study.db").exists()


@pytest.mark.parametrize("packing", [False, True])
def test_prompt_completion_rows_train_on_the_completion_alone(tmp_path, packing):
    rows = [{"prompt": [{"role": "user", "content": "pad a batch " * (1 + i % 5)}],
             "completion": [{"role": "assistant", "content": "rows " * (1 + i % 3)}]}
            for i in range(40)]  # fmt: skip
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    spec = DataSpec(data=str(data), tokenizer=str(EXAMPLES / "chat-tokenizer"), seq_len=64)
    folder = prepare(spec, tmp_path / "cache")
    prepared = datasets.load_from_disk(str(folder))
    assert COMPLETION_MASK in prepared.column_names
    assert all(0 < sum(m) < len(m) for m in prepared[COMPLETION_MASK])
    model = EXAMPLES / "tiny-llama"
    trial = TrialSpec(
        trial_number=0,
        model_name=str(model),
        model_config=resolve_model(str(model)).config,
        task="causal-lm",
        seq_len=64,
        device="cpu",
        # Packed rows train exactly under eager attention with position_ids (transformers 5).
        params={"batch_size": 4, "packing": packing, "attn_implementation": "eager"},
        warmup_steps=1,
        measure_steps=2,
        seed=0,
        data_dir=str(folder),
    )
    result = launch_trial(trial, tmp_path / "trial", timeout_s=600, launcher=ForkserverLauncher())
    assert result.status is Status.OK, result.reason + result.stderr_tail
    assert (result.padding_share == 0) is packing


def test_trls_sft_trainer_is_a_factory_whose_adapter_is_read_and_its_model_estimated(tmp_path):
    proc = autotune("search", "model=google/bert_uncased_L-2_H-128_A-2", "seq_len=256",
                    "trainer=examples/sft_trainer.py:make_trainer", *FAST, f"out={tmp_path}",
                    "study=sft", cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = load_records(study_of(tmp_path / "sft"))
    assert [r.status for r in records] == [Status.OK] * 3
    for r in records:
        assert r.result.peft_config == {
            "r": 8,
            "lora_alpha": 16,
            "lora_dropout": 0.05,
            # peft's all-linear, as the module names that target the same layers
            "target_modules": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj",
                               "up_proj", "v_proj"],
            "task_type": "CAUSAL_LM",
        }  # fmt: skip
        assert r.result.trained_task == "causal-lm"
        assert r.result.trained_config["num_hidden_layers"] == 2
        # from_config builds in the dtype its config.json states (transformers 5).
        assert r.result.trained_config["dtype"] == "bfloat16"
        # 2 blocks x r 8 x (in + out features) of q, k, v, o (64 wide, 2 of 4 heads for k
        # and v) and of gate, up, down (64 <-> 128).
        assert r.result.trainable_params == 2 * 8 * (128 + 96 + 96 + 128 + 3 * 192)
    # The baseline told what the factory trains (a Llama, where model= names a BERT); the
    # trials after it are estimated as that model, with its adapter, at its longest batch.
    assert records[0].result.estimate_gib is None
    for r in records[1:]:
        params, model = factory_model(r.params, records[0].result)
        found = estimate(model.config, task="causal-lm", seq_len=256, params=params,
                         device="cpu", adapter=r.result.peft_config)  # fmt: skip
        assert r.result.estimate_gib == pytest.approx(found.budgeted / 2**30), r.number
    assert "trials after trial 0 are estimated as that model" in " ".join(proc.stdout.split())
    recommended = json.loads((tmp_path / "sft" / "recommended.json").read_text())
    assert recommended["peft_config"] == records[0].result.peft_config


def test_the_chat_example_is_made_by_its_script_byte_for_byte(tmp_path):
    """docs/llm.md says `python examples/make_chat.py` made chat.jsonl and chat-tokenizer/: in a
    copy of examples/ without them, it makes the shipped files."""
    import shutil
    import subprocess
    import sys

    made = ["chat.jsonl", "chat-tokenizer"]
    shutil.copytree(EXAMPLES, tmp_path / "examples",
                    ignore=shutil.ignore_patterns(*made, "__pycache__"))  # fmt: skip
    run = subprocess.run([sys.executable, "examples/make_chat.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    shipped = sorted(p.relative_to(EXAMPLES) for name in made for p in _files(EXAMPLES / name))
    again = sorted(
        p.relative_to(tmp_path / "examples")
        for name in made
        for p in _files(tmp_path / "examples" / name)
    )
    assert again == shipped
    for path in shipped:
        assert (tmp_path / "examples" / path).read_bytes() == (EXAMPLES / path).read_bytes(), path


def _files(path: Path) -> list[Path]:
    return [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
