"""The package's version, written into every repository entry and reported by the server."""

__version__ = "0.1.0"
