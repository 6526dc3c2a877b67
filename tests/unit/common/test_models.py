import json

import pytest

from autotune.common.errors import ModelNotFoundError
from autotune.common.models import (
    catalogue_names,
    catalogue_parameter_counts,
    resolve_model,
    task_of_class,
)

REQUIRED = [
    "bert-base-uncased",
    "bert-large-uncased",
    "roberta-base",
    "roberta-large",
    "distilbert-base-uncased",
    "gpt2",
    "gpt2-medium",
    "t5-small",
    "t5-base",
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    "Qwen/Qwen2.5-0.5B",
    "google/bert_uncased_L-2_H-128_A-2",
    "google/bert_uncased_L-4_H-256_A-4",
]


def test_catalogue_holds_the_bundled_models_under_hub_names():
    assert set(REQUIRED) <= set(catalogue_names())


def test_every_catalogue_model_has_a_shipped_parameter_count():
    # tests/integration/test_models_meta.py checks the values against a recount.
    assert sorted(catalogue_parameter_counts()) == sorted(catalogue_names()), (
        "run `python -m autotune.child.models --write-counts` after changing the catalogue"
    )


@pytest.mark.parametrize(
    ("name", "task", "max_seq_len"),
    [
        ("bert-large-uncased", "sequence-classification", 512),
        ("roberta-base", "sequence-classification", 512),  # 514 positions, 2 used by padding
        ("gpt2", "causal-lm", 1024),
        ("t5-small", "seq2seq", None),
        ("Qwen/Qwen2.5-0.5B", "causal-lm", 32768),
        ("meta-llama/Llama-3.1-8B", "causal-lm", 131072),
        ("microsoft/Phi-3-mini-4k-instruct", "causal-lm", 4096),
        ("google/gemma-2-2b", "causal-lm", 8192),
    ],
)
def test_default_task_and_sequence_limit(name, task, max_seq_len):
    spec = resolve_model(name)
    assert spec.default_task == task
    assert spec.max_seq_len == max_seq_len


def test_a_local_folder_with_config_json(tmp_path):
    config = {"model_type": "gpt2", "n_layer": 1, "architectures": ["GPT2LMHeadModel"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = resolve_model(str(tmp_path))
    assert spec.source == "local"
    assert spec.default_task == "causal-lm"


@pytest.mark.parametrize("architectures", [None, []])
def test_a_llama_folder_naming_no_architecture_trains_as_a_causal_lm(tmp_path, architectures):
    # `LlamaConfig(...).save_pretrained(folder)` writes `"architectures": null`.
    config = {"model_type": "llama", "num_hidden_layers": 2, "architectures": architectures}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert resolve_model(str(tmp_path)).default_task == "causal-lm"


def test_a_bert_folder_naming_no_architecture_stays_a_classifier(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert resolve_model(str(tmp_path)).default_task == "sequence-classification"


def test_a_local_folder_without_config_json(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
        resolve_model(str(tmp_path))


def test_unknown_model_suggests_close_catalogue_names():
    with pytest.raises(ModelNotFoundError, match="did you mean bert-large-uncased"):
        resolve_model("bert-larg-uncased")


def test_a_local_config_with_nan_is_refused_before_any_trial(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert", "layer_norm_eps": NaN}')
    with pytest.raises(ModelNotFoundError, match="NaN is not a JSON number"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize(
    ("name", "task"),
    [
        ("LlamaForCausalLM", "causal-lm"),
        ("GPT2LMHeadModel", "causal-lm"),
        ("BertForSequenceClassification", "sequence-classification"),
        ("RobertaForMaskedLM", "masked-lm"),
        ("T5ForConditionalGeneration", "seq2seq"),
        ("LlamaModel", None),
    ],
)
def test_a_factorys_model_class_tells_its_task(name, task):
    assert task_of_class(name) == task
