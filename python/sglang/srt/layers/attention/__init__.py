"""Attention layers, the backends that compute them and the math underneath (see README.md)."""
