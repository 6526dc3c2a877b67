"""The README and the pages of docs/, as the tests that check what they show read them."""

from pathlib import Path

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """The text of docs/NAME."""
    return (DOCS / name).read_text()
