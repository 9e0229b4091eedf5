"""The SDK's version, in a module of its own: the package's face re-exports it, and the
connection names it in its User-Agent without importing the package (which imports the client)."""

__version__ = "0.1.0"
