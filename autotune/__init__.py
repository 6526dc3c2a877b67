"""autotune: find the fastest way to train a Hugging Face Transformers model on this hardware."""

__version__ = "0.1.0"
