"""Where the command line writes for people (defined with the rest of the view)."""

from autotune.view import console, errors

__all__ = ["console", "errors"]
