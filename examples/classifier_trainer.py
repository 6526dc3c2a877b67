"""A Trainer factory for `autotune search trainer=examples/classifier_trainer.py:make_trainer`.

autotune calls `make_trainer(args, model_kwargs)` in each trial with the TrainingArguments it
is trying (batch size, precision, loader settings, ... plus max_steps and no saving) and times
the Trainer it returns. Everything else is yours: here a small BERT classifier, built from a
config (no download), on the labelled lines of reviews.jsonl next to this file, tokenized by a
WordPiece tokenizer counted from them, and padded per batch by the HF padding collator.

Runs offline: python examples/classifier_trainer.py trains it for 3 steps.
"""

import collections
from pathlib import Path

import datasets
import tokenizers
import transformers

DATA = Path(__file__).with_name("reviews.jsonl")
MAX_LENGTH = 128
VOCAB_SIZE = 500


def make_tokenizer(texts: list[str]) -> transformers.PreTrainedTokenizerFast:
    """A WordPiece tokenizer with its vocabulary counted from `texts`: the special tokens,
    every character (alone and continuing a word), then the most frequent words (equal counts
    alphabetically) up to VOCAB_SIZE. Counted here rather than by the `tokenizers` WordPiece
    trainer, which orders equal counts differently from run to run: the same texts give the
    same tokenizer, byte for byte."""
    normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    counts = collections.Counter(
        word
        for text in texts
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
    )
    characters = sorted({c for word in counts for c in word})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *characters,
             *(f"##{c}" for c in characters)]  # fmt: skip
    frequent = sorted((w for w in counts if w not in vocab), key=lambda w: (-counts[w], w))
    vocab += frequent[: max(0, VOCAB_SIZE - len(vocab))]
    model = tokenizers.Tokenizer(tokenizers.models.WordPiece(
        vocab={token: i for i, token in enumerate(vocab)}, unk_token="[UNK]"))  # fmt: skip
    model.normalizer = normalizer
    model.pre_tokenizer = pre_tokenizer
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]",
    )  # fmt: skip


def make_trainer(args: transformers.TrainingArguments, model_kwargs: dict) -> transformers.Trainer:
    # autotune finds this line in each trial's log: the trial ran this factory's Trainer.
    print("classifier_trainer: building the example's own Trainer", flush=True)
    dataset = datasets.load_dataset("json", data_files=str(DATA), split="train")
    tokenizer = make_tokenizer(dataset["text"])
    dataset = dataset.map(
        lambda batch: tokenizer(batch["text"], truncation=True, max_length=MAX_LENGTH),
        batched=True,
        remove_columns=["text"],
    )
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=128, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=512, num_labels=2,
    )  # fmt: skip
    model = transformers.AutoModelForSequenceClassification.from_config(config, **model_kwargs)
    return transformers.Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=transformers.DataCollatorWithPadding(tokenizer),
    )


if __name__ == "__main__":
    arguments = transformers.TrainingArguments(
        output_dir="classifier-output", max_steps=3, report_to="none", use_cpu=True
    )
    make_trainer(arguments, {}).train()
