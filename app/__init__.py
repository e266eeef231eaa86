"""secure-release: the composition root (CLI, bundled data, wiring of the roles)."""

__version__ = "0.1.0"
