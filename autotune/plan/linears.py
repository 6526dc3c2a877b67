"""The linear layers of a transformer block by module name, read from its config: what peft's
`target_modules` names (and `all-linear` takes whole), what a quantized base quantizes. Parent
side and pure: a config dict in, (name, in features, out features) out.
"""

from __future__ import annotations

from typing import Any

# A block's linear layers by module name, (in, out) each, per family of model types: what peft
# targets by name (`all-linear`: every one). Models outside these have the generic four
# attention projections and the two MLP matrices.
_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo2"}
DECODER_LINEARS = _LLAMA_LIKE | {"phi3"}
"""The families whose blocks' linear layers are read whole here (grouped K and V heads)."""


def block_linears(
    config: dict[str, Any], hidden: int, intermediate: int, heads: int
) -> list[tuple[str, int, int]]:
    """(module name, in features, out features) of each linear layer of one block."""
    model_type = config.get("model_type")
    head_dim = config.get("head_dim") or hidden // max(heads, 1)
    kv = (config.get("num_key_value_heads") or heads) * head_dim
    q = heads * head_dim
    if model_type in _LLAMA_LIKE:
        return [
            ("q_proj", hidden, q), ("k_proj", hidden, kv), ("v_proj", hidden, kv),
            ("o_proj", q, hidden), ("gate_proj", hidden, intermediate),
            ("up_proj", hidden, intermediate), ("down_proj", intermediate, hidden),
        ]  # fmt: skip
    if model_type == "phi3":
        return [
            ("qkv_proj", hidden, q + 2 * kv), ("o_proj", q, hidden),
            ("gate_up_proj", hidden, 2 * intermediate), ("down_proj", intermediate, hidden),
        ]  # fmt: skip
    if model_type == "gpt2":
        return [
            ("c_attn", hidden, 3 * hidden), ("c_proj", hidden, hidden),
            ("c_fc", hidden, intermediate), ("c_proj", intermediate, hidden),
        ]  # fmt: skip
    if model_type in ("bert", "roberta"):
        return [
            ("query", hidden, hidden), ("key", hidden, hidden), ("value", hidden, hidden),
            ("dense", hidden, hidden), ("dense", hidden, intermediate),
            ("dense", intermediate, hidden),
        ]  # fmt: skip
    return [
        ("q", hidden, hidden), ("k", hidden, hidden), ("v", hidden, hidden),
        ("o", hidden, hidden), ("wi", hidden, intermediate), ("wo", intermediate, hidden),
    ]  # fmt: skip


def targeted(
    linears: list[tuple[str, int, int]], targets: str | list[str]
) -> list[tuple[str, int, int]]:
    """The block's linear layers an adapter targets: all of them (`all-linear`), or those
    whose name is a target (peft matches a module's name, or the end of its path)."""
    if targets == "all-linear":
        return linears
    names = {t.rsplit(".", 1)[-1] for t in targets}
    return [linear for linear in linears if linear[0] in names]
