"""The package version (its own module, so code inside the package can read it without importing
`sglang` itself)."""

__version__ = "0.1.0"
