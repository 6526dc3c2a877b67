"""Parameter counts come from a subprocess that builds each model on the meta device; the
catalogue's counts are shipped so that `autotune models` need not, and must match a recount."""

from autotune.child.models import count_parameters
from autotune.common.models import catalogue_names, catalogue_parameter_counts

PUBLISHED_SIZES = {
    "meta-llama/Llama-3.2-1B": 1.24,
    "meta-llama/Llama-3.2-3B": 3.21,
    "meta-llama/Llama-3.1-8B": 8.03,
    "Qwen/Qwen2.5-1.5B": 1.54,
    "Qwen/Qwen2.5-7B": 7.62,  # the card: 7.61B (7,615,616,512)
    "Qwen/Qwen3-8B": 8.19,  # the card: 8.2B
    "mistralai/Mistral-7B-v0.3": 7.25,
    "google/gemma-2-2b": 2.61,
    "HuggingFaceTB/SmolLM2-1.7B": 1.71,
    "microsoft/Phi-3-mini-4k-instruct": 3.82,
}
"""The hub's parameter counts of the bundled LLMs (each model card's, to two decimals)."""


def test_the_shipped_parameter_counts_match_a_recount_on_the_meta_device():
    recount = count_parameters(catalogue_names())
    # bert-large with a 2-label classification head: 335,143,938 parameters.
    assert 334e6 < recount["bert-large-uncased"] < 336e6
    assert 1.09e9 < recount["TinyLlama/TinyLlama-1.1B-Chat-v1.0"] < 1.11e9
    # Today's causal LMs at the sizes their model cards publish (in billions, as rounded there).
    for name, billions in PUBLISHED_SIZES.items():
        assert round(recount[name] / 1e9, 2) == billions, (name, recount[name])
    assert recount == catalogue_parameter_counts(), (
        "the installed transformers builds different models: "
        "run `python -m autotune.child.models --write-counts`"
    )
