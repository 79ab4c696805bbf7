"""The one error every loading step raises, so that the server can report it and exit."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """Raised with a message naming exactly what is missing or mismatched and how to provide it."""
