"""Model name -> transformers config, offline first.

Both sides read configs here as JSON dicts, without torch or transformers; building a model
happens in a trial (`autotune.child.models`). The catalogue's parameter counts are shipped data
(`model_parameter_counts.json`), written by `python -m autotune.child.models --write-counts`,
which builds each model on the meta device.
"""

from __future__ import annotations

import difflib
import json
import os
import socket
import urllib.parse
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from autotune.common.errors import AutotuneError, ModelNotFoundError

# Task -> (the Auto class that builds its head, the transformers table of model types it has).
TASK_CLASSES = {
    "sequence-classification": (
        "AutoModelForSequenceClassification",
        "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    ),
    "causal-lm": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "masked-lm": ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    "seq2seq": ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
}
CLASS_TASKS = (
    (("ForCausalLM", "LMHeadModel"), "causal-lm"),
    (("ForSequenceClassification",), "sequence-classification"),
    (("ForMaskedLM",), "masked-lm"),
    (("ForSeq2SeqLM", "ForConditionalGeneration"), "seq2seq"),
)
"""A model class's name ending -> the task it trains (`task_of_class`)."""


def task_of_class(class_name: str) -> str | None:
    """The task a model class trains (`LlamaForCausalLM`: causal-lm); None for another head."""
    return next((task for ends, task in CLASS_TASKS if class_name.endswith(ends)), None)


# Models whose learned position table starts after the padding index (position ids run from
# pad_token_id + 1), so seq_len can reach max_position_embeddings - pad_token_id - 1 only.
_PADDING_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "camembert", "longformer"}
# Decoder-only model types: a config that names no architecture (a folder written by
# `LlamaConfig().save_pretrained`) is a causal LM, not a classifier.
_DECODER_ONLY = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe",
                 "gemma", "gemma2", "gemma3_text", "phi", "phi3", "gpt2", "gpt_neox", "gptj",
                 "falcon", "olmo", "olmo2", "starcoder2", "smollm3", "granite"}  # fmt: skip
# Relative position schemes: no hard sequence limit in the config.
_RELATIVE_POSITIONS = {"t5", "mt5", "umt5"}
PARAMETER_COUNTS_FILE = "model_parameter_counts.json"
"""Next to `model_configs/`, not in it: every file in that folder is a catalogue model."""
WRITE_COUNTS = "--write-counts"


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    name: str
    source: str
    """Where the config came from: catalogue, local or hub."""
    config: dict[str, Any]

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    @property
    def default_task(self) -> str:
        if self.config.get("is_encoder_decoder"):
            return "seq2seq"
        architectures = self.config.get("architectures") or []
        if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
            return "causal-lm"
        if not architectures and self.model_type in _DECODER_ONLY:
            return "causal-lm"
        return "sequence-classification"

    @property
    def max_seq_len(self) -> int | None:
        if self.model_type in _RELATIVE_POSITIONS:
            return None
        positions = self.config.get("max_position_embeddings") or self.config.get("n_positions")
        if positions and self.model_type in _PADDING_OFFSET_POSITIONS:
            return positions - self.config.get("pad_token_id", 1) - 1
        return positions


def _catalogue_dir() -> resources.abc.Traversable:
    return resources.files("autotune") / "model_configs"


def catalogue_names() -> list[str]:
    names = [p.name.removesuffix(".json") for p in _catalogue_dir().iterdir()]
    return sorted((n.replace("--", "/") for n in names if not n.startswith(".")), key=str.lower)


def resolve_offline(name: str) -> ModelSpec | None:
    """The model from the catalogue or a local folder, without asking the hub; None otherwise
    (or when its folder cannot be read: `resolve_model` says why)."""
    try:
        bundled = _catalogue_dir() / (name.replace("/", "--") + ".json")
        if bundled.is_file() or (Path(name).expanduser() / "config.json").is_file():
            return resolve_model(name)
    except (AutotuneError, OSError, ValueError):
        return None
    return None


def resolve_model(name: str) -> ModelSpec:
    """Catalogue name, local folder with config.json, or hub id (when the hub is reachable)."""
    bundled = _catalogue_dir() / (name.replace("/", "--") + ".json")
    if bundled.is_file():
        return ModelSpec(name=name, source="catalogue", config=json.loads(bundled.read_text()))
    local = Path(name).expanduser()
    if local.is_dir():
        config_file = local / "config.json"
        if not config_file.is_file():
            raise ModelNotFoundError(f"model={name}: folder has no config.json")
        return ModelSpec(name=name, source="local", config=_read_config(config_file))
    hub_config = _fetch_hub_config(name)
    if hub_config is not None:
        return ModelSpec(name=name, source="hub", config=_read_config(hub_config))
    close = difflib.get_close_matches(name, catalogue_names(), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ModelNotFoundError(
        f"model={name}: not in the catalogue, not a local folder, and not reachable on the hub; "
        f"{hint}`autotune models` lists the bundled models"
    )


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(), parse_constant=_refuse_non_finite)
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        raise ModelNotFoundError(f"{path}: not a readable JSON config ({exc})") from exc
    if "model_type" not in config:
        raise ModelNotFoundError(f"{path}: config.json has no model_type")
    return config


def _refuse_non_finite(constant: str) -> float:
    # Python's json accepts NaN and Infinity, which are not JSON and no Python literal: the
    # exported script could not hold such a config.
    raise ValueError(f"{constant} is not a JSON number")


def _fetch_hub_config(name: str) -> Path | None:
    """Download config.json from the hub; None when offline or the repo does not exist."""
    if hub_offline():
        return None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        return Path(hf_hub_download(name, "config.json"))
    except (HfHubHTTPError, OfflineModeIsEnabled, OSError, ValueError):
        # Any of: no network, unknown repo, gated repo, invalid repo id. All mean "not found"
        # for the user, who gets the catalogue's close matches instead.
        return None


def hub_offline() -> bool:
    """Whether the hub cannot be used: offline mode is on, or it cannot be reached."""
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false") or not _hub_reachable()


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """One quick TCP connect, so an offline machine answers in seconds, not after retries.
    The endpoint is read as huggingface_hub reads it, without importing it (it reads the
    offline switch once, when imported)."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = urllib.parse.urlparse(endpoint).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def catalogue_parameter_counts() -> dict[str, int]:
    """The shipped parameter count of each catalogue model, with its default task's head.

    Building the models on the meta device takes seconds of torch and transformers imports,
    too slow for `autotune models`; an integration test checks the file against a recount.
    """
    shipped = json.loads((resources.files("autotune") / PARAMETER_COUNTS_FILE).read_text())
    return shipped["parameters"]


# ---- worker side: everything below imports transformers and runs only in child processes ----
