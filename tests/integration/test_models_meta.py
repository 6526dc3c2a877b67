"""Parameter counts come from a subprocess that builds each model on the meta device; the
catalogue's counts are shipped so that `autotune models` need not, and must match a recount."""

from autotune.child.models import count_parameters
from autotune.common.models import catalogue_names, catalogue_parameter_counts


def test_the_shipped_parameter_counts_match_a_recount_on_the_meta_device():
    recount = count_parameters(catalogue_names())
    # bert-large with a 2-label classification head: 335,143,938 parameters.
    assert 334e6 < recount["bert-large-uncased"] < 336e6
    assert 1.09e9 < recount["TinyLlama/TinyLlama-1.1B-Chat-v1.0"] < 1.11e9
    assert recount == catalogue_parameter_counts(), (
        "the installed transformers builds different models: "
        "run `python -m autotune.child.models --write-counts`"
    )
