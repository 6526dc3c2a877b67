"""Parameter counts come from a subprocess that builds each model on the meta device."""

from autotune.models import count_parameters


def test_parameter_counts_on_the_meta_device():
    counts = count_parameters(["bert-large-uncased", "TinyLlama/TinyLlama-1.1B-Chat-v1.0"])
    # bert-large with a 2-label classification head: 335,143,938 parameters.
    assert 334e6 < counts["bert-large-uncased"] < 336e6
    assert 1.09e9 < counts["TinyLlama/TinyLlama-1.1B-Chat-v1.0"] < 1.11e9
