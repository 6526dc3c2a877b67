"""How a row of the user's data (`data=`) becomes tokens, for each layout a dataset comes in.

- tokens: `input_ids` already (kept, truncated at seq_len);
- text: a text column (`text_column=`), tokenized as it is;
- messages: a column of chat turns (`[{"role": "user", "content": "..."}, ...]`: a `messages`
  column, or `text_column=` naming one), rendered by the tokenizer's chat template;
- prompt-completion: `prompt` and `completion` columns (text, or turns), the loss on the
  completion alone (`completion_mask`), as TRL's SFTTrainer trains them.

Pure and without torch: `autotune.child.prepare_data` tokenizes with these once per study, and
`recommended.py` holds a copy of them (`autotune.outputs.script`), so that the script tokenizes
the data as the trials had it.
"""

from __future__ import annotations

from typing import Any

TOKENS, TEXT, MESSAGES, PROMPT_COMPLETION = "tokens", "text", "messages", "prompt-completion"
DEFAULT_TEXT_COLUMN = "text"
"""`text_column`'s default: where it is missing, a `messages` column or `prompt`/`completion`
columns are looked for instead (a column named otherwise must be there)."""
COMPLETION_MASK = "completion_mask"
"""Per token, 1 where the loss counts it (the completion), 0 in the prompt: TRL's name."""


def turn_columns(schema: Any) -> set[str]:
    """The columns of a pyarrow schema that hold lists of records (chat turns)."""
    import pyarrow

    def turns(kind: Any) -> bool:
        listed = pyarrow.types.is_list(kind) or pyarrow.types.is_large_list(kind)
        return listed and pyarrow.types.is_struct(kind.value_type)

    return {field.name for field in schema if turns(field.type)}


def layout_of(columns: list[str], text_column: str, turns: set[str]) -> tuple[str, str] | None:
    """(layout, the column it reads) of a dataset with these columns (`turns`: those holding
    chat turns); None when it holds none of the layouts."""
    if "input_ids" in columns:
        return TOKENS, "input_ids"
    if text_column in columns:
        return (MESSAGES if text_column in turns else TEXT), text_column
    if text_column != DEFAULT_TEXT_COLUMN:
        return None
    if "messages" in columns:
        return MESSAGES, "messages"
    if "prompt" in columns and "completion" in columns:
        return PROMPT_COMPLETION, "prompt"
    return None


def encode(
    batch: dict[str, list], *, layout: str, column: str, tokenizer: Any, seq_len: int
) -> dict[str, list]:
    """Token ids of a batch of rows (`Dataset.map(batched=True)`), truncated at `seq_len`,
    unpadded; with `completion_mask` for prompt-completion rows."""
    if layout == TEXT:
        return dict(tokenizer(batch[column], truncation=True, max_length=seq_len))
    if layout == MESSAGES:
        # The template writes the model's own special tokens (BOS, turn markers): none added.
        texts = [tokenizer.apply_chat_template(turns, tokenize=False) for turns in batch[column]]
        return dict(tokenizer(texts, add_special_tokens=False, truncation=True, max_length=seq_len))
    rows = {"input_ids": [], COMPLETION_MASK: []}
    for prompt, completion in zip(batch["prompt"], batch["completion"], strict=True):
        if isinstance(prompt, list):  # turns: the prompt ends asking for the assistant's turn
            prompt_text = tokenizer.apply_chat_template(
                prompt, tokenize=False, add_generation_prompt=True
            )
            whole = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
            prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
            ids = tokenizer(whole, add_special_tokens=False)["input_ids"]
        else:  # text: the completion ends with the end-of-text token, as TRL appends it
            end = tokenizer.eos_token or ""
            if end and completion.endswith(end):
                end = ""
            prompt_ids = tokenizer(prompt)["input_ids"]
            ids = tokenizer(prompt + completion + end)["input_ids"]
        shown = min(len(prompt_ids), len(ids))
        rows["input_ids"].append(ids[:seq_len])
        rows[COMPLETION_MASK].append(([0] * shown + [1] * (len(ids) - shown))[:seq_len])
    return rows
