"""The data a trial trains on (worker side).

Synthetic by default: random token ids of one length, as the HF guide measures, so data
loading is kept out of what is measured. The user's own data (`data=`) is the folder
`autotune.child.prepare_data` wrote, memory-mapped by each trial after it is forked, and batched
by `PaddingCollator`: padded to the longest sample of each batch (rounded up to a multiple),
so padding, length grouping and the loader are part of what is measured; or, packed, by
transformers' `DataCollatorWithFlattening` (`CompletionFlattening` for prompt-completion rows).
"""

from __future__ import annotations

import math
from typing import Any

import torch

IGNORE_INDEX = -100
"""Label positions the loss skips (padding)."""


class SyntheticDataset(torch.utils.data.Dataset):
    """Random token ids of one length, with labels the task's head expects."""

    def __init__(self, *, task: str, vocab_size: int, seq_len: int, n_samples: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(vocab_size, (n_samples, seq_len), generator=generator)
        if task == "sequence-classification":
            self.labels = torch.randint(2, (n_samples,), generator=generator)
        elif task == "seq2seq":
            self.labels = torch.randint(vocab_size, (n_samples, seq_len), generator=generator)
        else:  # causal-lm shifts inside the model; masked-lm predicts every position
            self.labels = self.input_ids

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[i], "labels": self.labels[i]}


class PaddingCollator:
    """Pads a list of tokenized samples to the longest one, rounded up to `pad_to_multiple_of`
    (8 or 64 suit tensor cores), and makes the labels the task's head expects: the sample's
    `label` for sequence classification (0 when the data has none), else its own tokens with
    padding ignored by the loss."""

    def __init__(self, *, task: str, pad_token_id: int, pad_to_multiple_of: int = 1) -> None:
        self.task = task
        self.pad_token_id = pad_token_id
        self.multiple = pad_to_multiple_of

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(s["input_ids"]) for s in samples)
        length = math.ceil(longest / self.multiple) * self.multiple
        input_ids = torch.full((len(samples), length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(samples), length), dtype=torch.long)
        counted = torch.zeros((len(samples), length), dtype=torch.bool)  # by the loss
        for row, sample in enumerate(samples):
            ids = torch.as_tensor(sample["input_ids"], dtype=torch.long)
            input_ids[row, : len(ids)] = ids
            attention_mask[row, : len(ids)] = 1
            # A prompt-completion sample's prompt is not trained on (`completion_mask` 0).
            mask = sample.get("completion_mask")
            counted[row, : len(ids)] = True if mask is None else torch.as_tensor(mask) == 1
        if self.task == "sequence-classification":
            labels = torch.tensor([int(s.get("label", s.get("labels", 0))) for s in samples])
        else:
            labels = input_ids.masked_fill(~counted, IGNORE_INDEX)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class CompletionFlattening:
    """transformers' `DataCollatorWithFlattening` (a batch's samples in one row, none padded)
    on prompt-completion samples: their prompt tokens labelled to be ignored by the loss."""

    def __init__(self) -> None:
        import transformers

        self.flatten = transformers.DataCollatorWithFlattening()

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        labelled = [
            {
                "input_ids": s["input_ids"],
                "labels": [
                    t if m else IGNORE_INDEX
                    for t, m in zip(s["input_ids"], s["completion_mask"], strict=True)
                ],
            }
            for s in samples
        ]
        return self.flatten(labelled)
