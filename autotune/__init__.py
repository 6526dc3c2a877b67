"""autotune: find the fastest way to train a Hugging Face Transformers model on this hardware.

import autotune
result = autotune.search(model="bert-large-uncased", seq_len=512, n_trials=30)
result.recommended.training_args()   # transformers.TrainingArguments
autotune.load("reports/bert-large-uncased-cuda-s512").to_dataframe()
"""

from typing import Any

from autotune.common.version import __version__ as __version__

__all__ = ["SearchResult", "load", "search"]


def __getattr__(name: str) -> Any:
    # Loaded on first use, so `import autotune` (and the command line's small commands) do not
    # pay for optuna, plotly and the rest.
    if name in __all__:
        from autotune import api

        return getattr(api, name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
