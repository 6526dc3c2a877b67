"""A TRL SFTTrainer factory: `autotune search trainer=examples/sft_trainer.py:make_trainer`.

LoRA adapters (peft) on a tiny Llama-architecture model built from `tiny-llama/config.json`
(random weights, no download), trained by TRL's SFTTrainer on the conversations of
`chat.jsonl`, which it renders with `chat-tokenizer`'s chat template. autotune calls
`make_trainer(args, model_kwargs)` in each trial with the TrainingArguments it is trying and
times the Trainer it returns; SFTConfig takes them as they are.

Runs offline: python examples/sft_trainer.py trains it for 3 steps.
"""

from pathlib import Path

import datasets
import peft
import transformers
import trl

HERE = Path(__file__).parent
MAX_LENGTH = 256
ADAPTER = peft.LoraConfig(
    r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"
)


def make_trainer(args: transformers.TrainingArguments, model_kwargs: dict) -> trl.SFTTrainer:
    config = transformers.AutoConfig.from_pretrained(HERE / "tiny-llama")
    model = transformers.AutoModelForCausalLM.from_config(config, **model_kwargs)
    dataset = datasets.load_dataset("json", data_files=str(HERE / "chat.jsonl"), split="train")
    return trl.SFTTrainer(
        model=model,
        args=trl.SFTConfig(**args.to_dict(), max_length=MAX_LENGTH),
        train_dataset=dataset,
        processing_class=transformers.AutoTokenizer.from_pretrained(HERE / "chat-tokenizer"),
        peft_config=ADAPTER,  # SFTTrainer wraps the model: the Trainer trains a PeftModel
    )


if __name__ == "__main__":
    args = transformers.TrainingArguments(output_dir="sft-out", max_steps=3, report_to="none")
    print(make_trainer(args, {}).train())
