"""Where the lines a person reads go: the terminal's two consoles (stdout, and stderr for
errors), and the `Reporter` that prints a line there and appends it, plain, to the study's log.
The live view of a search (`view.py`) and its end-of-search printout (`outcome.py`) print
through it; so does the command line, which also names the files a search wrote as they do.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
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

    def line(self, markup: str, *, always: bool = False, log_only: bool = False) -> None:
        if (always or not self.quiet) and not log_only:
            console.print(markup, soft_wrap=True)
        if self.log_path is not None:
            self._append(self.log_path, Text.from_markup(markup).plain + "\n")

    def _append(self, path: Path, text: str) -> None:
        # O_NOFOLLOW: a link planted at the log's name is refused, not appended through.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        try:
            with open(os.open(path, flags, 0o644), "a") as log:
                log.write(text)
        except OSError as exc:  # a full disk: the search goes on, its lines on the terminal
            errors.print(
                f"[yellow]warning:[/] cannot append to {escape(str(path))}: "
                f"{exc.strerror}; the search goes on without it"
            )
            self.log_path = None


def print_paths(report: Reporter, paths: list[Path]) -> None:
    report.line(always=True, markup="wrote " + escape(shown_paths(paths)))


def shown_paths(paths: list[Path]) -> str:
    """`reports/s/trials.csv, ...`: as the end of a search names what it wrote."""
    return ", ".join(shown_path(p) for p in paths)


def shown_path(path: Path) -> str:
    """Relative to the working folder when inside it (`reports/...`), else absolute."""
    path = path.resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)
