"""Text data made offline for the tests of `data=`: varied-length lines in jsonl, and a
WordPiece tokenizer trained on them with `tokenizers`, saved as transformers saves one."""

import json
import random
from pathlib import Path

WORDS = (
    "the model trains fast on real text with many words of varied length while a loader pads "
    "each batch to its longest sample and groups samples of similar length"
).split()


def write_corpus(path: Path, lines: int = 300, seed: int = 0) -> Path:
    """`lines` rows of {"text", "label"}, 3 to 120 words each."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(lines):
            words = rng.choices(WORDS, k=rng.randint(3, 120))
            f.write(json.dumps({"text": " ".join(words), "label": i % 2}) + "\n")
    return path


def train_tokenizer(corpus: Path, folder: Path) -> Path:
    """A BERT-style WordPiece tokenizer trained on the corpus, in `folder`."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token="[UNK]"))
    model.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    model.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = tokenizers.trainers.WordPieceTrainer(vocab_size=200, special_tokens=special)
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    model.train_from_iterator(texts, trainer)
    model.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[
            ("[CLS]", model.token_to_id("[CLS]")),
            ("[SEP]", model.token_to_id("[SEP]")),
        ],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=model,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    tokenizer.save_pretrained(folder)
    return folder
