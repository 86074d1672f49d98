"""The one place the package version is written (hatchling reads it for the build)."""

__version__ = "0.2.0.dev0"
