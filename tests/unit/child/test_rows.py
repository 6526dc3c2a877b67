"""How rows become tokens: the layout a dataset's columns make, chat turns rendered by the
tokenizer's chat template, and a prompt-completion row's prompt left out of the loss (with
the chat example's tokenizer, `examples/chat-tokenizer`)."""

from pathlib import Path

import pytest

from autotune.child.rows import (
    COMPLETION_MASK,
    MESSAGES,
    PROMPT_COMPLETION,
    TEXT,
    TOKENS,
    encode,
    layout_of,
    turn_columns,
)

TOKENIZER = Path(__file__).parents[3] / "examples" / "chat-tokenizer"
TURNS = [{"role": "user", "content": "pad a batch"}, {"role": "assistant", "content": "rows"}]


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    return transformers.AutoTokenizer.from_pretrained(TOKENIZER)


@pytest.mark.parametrize(
    ("columns", "text_column", "turns", "layout"),
    [
        (["input_ids", "text"], "text", set(), (TOKENS, "input_ids")),
        (["text", "messages"], "text", {"messages"}, (TEXT, "text")),
        (["messages"], "text", {"messages"}, (MESSAGES, "messages")),
        (["chat"], "chat", {"chat"}, (MESSAGES, "chat")),
        (["prompt", "completion"], "text", set(), (PROMPT_COMPLETION, "prompt")),
        (["prompt"], "text", set(), None),
        # A column named by the user must be there: no other is taken in its place.
        (["messages", "prompt", "completion"], "body", {"messages"}, None),
    ],
)
def test_a_datasets_columns_tell_its_layout(columns, text_column, turns, layout):
    assert layout_of(columns, text_column, turns) == layout


def test_columns_of_records_are_chat_turns():
    import pyarrow

    table = pyarrow.Table.from_pylist([{"messages": TURNS, "text": "x", "ids": [1, 2]}])
    assert turn_columns(table.schema) == {"messages"}


def test_turns_are_rendered_by_the_chat_template_with_its_own_special_tokens(tokenizer):
    encoded = encode({"messages": [TURNS]}, layout=MESSAGES, column="messages",
                     tokenizer=tokenizer, seq_len=64)  # fmt: skip
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    # One BOS from the template, none added on top; each turn after its role's marker.
    assert tokens[:2] == ["<s>", "<|user|>"] and tokens.count("<s>") == 1
    assert tokens[tokens.index("<|assistant|>") + 1] == "rows" and tokens[-1] == "</s>"


@pytest.mark.parametrize("chat", [False, True])
def test_the_loss_counts_the_completion_alone(tokenizer, chat):
    if chat:
        batch = {"prompt": [TURNS[:1]], "completion": [TURNS[1:]]}
    else:
        batch = {"prompt": ["pad a batch"], "completion": [" rows"]}
    encoded = encode(batch, layout=PROMPT_COMPLETION, column="prompt", tokenizer=tokenizer,
                     seq_len=64)  # fmt: skip
    ids, mask = encoded["input_ids"][0], encoded[COMPLETION_MASK][0]
    assert len(ids) == len(mask)
    counted = tokenizer.convert_ids_to_tokens([t for t, m in zip(ids, mask, strict=True) if m])
    assert counted == ["rows", "</s>"]  # the completion, ended by EOS (TRL appends it)
    short = encode(batch, layout=PROMPT_COMPLETION, column="prompt", tokenizer=tokenizer,
                   seq_len=3)  # fmt: skip
    assert len(short["input_ids"][0]) == len(short[COMPLETION_MASK][0]) == 3
