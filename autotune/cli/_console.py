"""Where the command line writes: the terminal, and for a search also its log file."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

# Piped output (logs, CI) gets long lines instead of rich's 80-column default, so names and
# settings are never cut or folded.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
errors = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)


class Reporter:
    """Prints to the terminal (unless quiet) and appends the same lines, plain, to a log."""

    def __init__(self, *, quiet: bool = False, log_path: Path | None = None) -> None:
        self.quiet = quiet
        self.log_path = log_path

    def open_log(self, path: Path) -> None:
        self.log_path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def line(self, markup: str, *, always: bool = False) -> None:
        if always or not self.quiet:
            console.print(markup, soft_wrap=True)
        if self.log_path is not None:
            with open(self.log_path, "a") as log:
                log.write(Text.from_markup(markup).plain + "\n")
