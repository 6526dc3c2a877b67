"""How many FLOPs a training step computes: one formula for the estimate before a trial
(`autotune.plan.estimate`) and the MFU a trial measures (`autotune.child.measure`)."""


def training_flops(
    matmul_weights: int,
    attention_blocks: int,
    width: int,
    tokens: int,
    squared_lengths: int,
    *,
    frozen_weights: int = 0,
) -> float:
    """Training FLOPs (forward + backward), after PaLM's appendix B: 6 per matmul weight per
    token (2 forward, 4 backward), plus the attention scores and the weighted sum, 12 x width
    x length^2 per sample per attention block (`squared_lengths` sums length^2 over the
    samples). Of the `matmul_weights`, `frozen_weights` (a base an adapter trains on) compute
    4 a token: their backward gives the activations' gradient, not their own (LoRA's saving).
    Activation checkpointing recomputes the forward but does not change the model's FLOPs, so
    MFU does not reward it. The one formula of the estimate and the worker's MFU."""
    weights = 6 * matmul_weights - 2 * frozen_weights
    return weights * tokens + 12 * attention_blocks * width * squared_lengths
