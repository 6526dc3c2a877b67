"""The values knobs take, and facts about them: optimizer families."""

import pytest

from autotune.common.knob_values import optimizer_family


@pytest.mark.parametrize(
    ("optim", "family"),
    [
        ("adamw_torch", "AdamW"),
        ("adamw_torch_fused", "AdamW"),
        ("paged_adamw_32bit", "AdamW"),
        ("adamw_bnb_8bit", "AdamW (8-bit states)"),
        ("adafactor", "Adafactor"),
        ("paged_ademamix_8bit", "AdEMAMix (8-bit states)"),
        ("lion_32bit", "Lion"),
        ("sgd", "SGD"),
    ],
)
def test_optimizer_families(optim, family):
    assert optimizer_family(optim) == family
