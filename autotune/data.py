"""The data a trial trains on (worker side).

Synthetic today: random token ids of one length, as the HF guide measures, so data loading is
kept out of what is measured. A `datasets` pipeline of the user's own data goes beside it.
"""

from __future__ import annotations

import torch


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
