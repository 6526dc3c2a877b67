"""autotune's version: one home, read by the package build (`pyproject.toml`) and stored with
every study's measurements."""

__version__ = "0.1.0"
