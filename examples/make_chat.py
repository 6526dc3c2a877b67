"""Writes the chat example's data and tokenizer (docs/llm.md): `chat.jsonl`, 200 conversations
as a `messages` column of role/content turns, and `chat-tokenizer/`, a WordPiece tokenizer
counted from their words, with BOS/EOS tokens and a chat template, saved with save_pretrained.

    python examples/make_chat.py

The words are drawn with a fixed seed: the same files every time, byte for byte.
"""

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from classifier_trainer import make_tokenizer  # noqa: E402

WORDS = (
    "batch pad token model loader train step memory kernel adapter rank base layer sample "
    "length text fast slow long short packs rows turns answer question"
).split()
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""Each turn after its role's marker, ended by EOS; the assistant's marker to generate."""


def conversations(rows: int = 200, seed: int = 0) -> list[dict]:
    """`rows` conversations of one to three exchanges of 3-60 words a turn."""
    draw = random.Random(seed)

    def turn(role: str) -> dict:
        return {"role": role, "content": " ".join(draw.choices(WORDS, k=draw.randint(3, 60)))}

    return [
        {
            "messages": [
                turn(role) for _ in range(draw.randint(1, 3)) for role in ("user", "assistant")
            ]
        }
        for _ in range(rows)
    ]


def main() -> None:
    rows = conversations()
    with open(HERE / "chat.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    texts = [turn["content"] for row in rows for turn in row["messages"]]
    tokenizer = make_tokenizer(texts)
    markers = [f"<|{role}|>" for role in ("system", "user", "assistant")]
    tokenizer.add_special_tokens({"bos_token": "<s>", "eos_token": "</s>"})
    tokenizer.add_tokens(markers, special_tokens=True)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(HERE / "chat-tokenizer")


if __name__ == "__main__":
    main()
