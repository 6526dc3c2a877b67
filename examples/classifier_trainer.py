"""A Trainer factory for `autotune search trainer=examples/classifier_trainer.py:make_trainer`.

autotune calls `make_trainer(args, model_kwargs)` in each trial with the TrainingArguments it
is trying (batch size, precision, loader settings, ... plus max_steps and no saving) and times
the Trainer it returns. Everything else is yours: here a small BERT classifier, built from a
config (no download), on the labelled lines of reviews.jsonl next to this file, tokenized by a
WordPiece tokenizer trained on them, and padded per batch by the HF padding collator.

Runs offline: python examples/classifier_trainer.py trains it for 3 steps.
"""

from pathlib import Path

import datasets
import tokenizers
import transformers

DATA = Path(__file__).with_name("reviews.jsonl")
MAX_LENGTH = 128


def make_tokenizer(texts: list[str]) -> transformers.PreTrainedTokenizerFast:
    model = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token="[UNK]"))
    model.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    model.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    model.train_from_iterator(
        texts, tokenizers.trainers.WordPieceTrainer(vocab_size=500, special_tokens=special)
    )
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
