"""Fused C++ kernels for the CPU platform (decode attention, norms, SwiGLU, RoPE)."""
