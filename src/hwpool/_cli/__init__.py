"""The hwpool command and what only it uses."""

from ._main import main

__all__ = ["main"]
