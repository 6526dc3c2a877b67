"""Batches of the user's data: padded per batch to a multiple, labels for each task, and the
real (non-pad) tokens counted."""

import torch

from autotune.child.data import IGNORE_INDEX, CompletionFlattening, PaddingCollator

SAMPLES = [{"input_ids": [5, 6, 7], "label": 1}, {"input_ids": [8], "label": 0}]


def test_a_batch_is_padded_to_its_longest_sample_rounded_up_to_the_multiple():
    batch = PaddingCollator(task="sequence-classification", pad_token_id=0)(SAMPLES)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [1, 0]
    eight = PaddingCollator(task="sequence-classification", pad_token_id=0, pad_to_multiple_of=8)
    assert eight(SAMPLES)["input_ids"].shape == (2, 8)
    # The padding share grows; the real tokens (what `measure` counts) do not.
    assert int(eight(SAMPLES)["attention_mask"].sum()) == 4


def test_language_model_labels_are_the_tokens_with_padding_ignored():
    batch = PaddingCollator(task="causal-lm", pad_token_id=3)(
        [{"input_ids": [5, 6]}, {"input_ids": [7]}]
    )
    assert batch["input_ids"].tolist() == [[5, 6], [7, 3]]
    assert batch["labels"].tolist() == [[5, 6], [7, IGNORE_INDEX]]
    assert batch["labels"].dtype == torch.long


PROMPTED = [
    {"input_ids": [5, 6, 7, 8], "completion_mask": [0, 0, 1, 1]},
    {"input_ids": [9, 10], "completion_mask": [0, 1]},
]
"""Prompt-completion samples: the loss counts the completion (`completion_mask` 1) alone."""


def test_a_prompts_tokens_are_left_out_of_the_loss_padded_or_packed():
    padded = PaddingCollator(task="causal-lm", pad_token_id=0)(PROMPTED)
    assert padded["labels"].tolist() == [[-100, -100, 7, 8], [-100, 10, -100, -100]]
    assert padded["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    packed = CompletionFlattening()(PROMPTED)
    assert packed["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10]]
    # Each sample's first label is the separator (-100), as the flattening collator makes it.
    assert packed["labels"].tolist() == [[-100, -100, 7, 8, -100, 10]]
    assert packed["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1]]
