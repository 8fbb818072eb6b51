"""Native kernels: per-platform builds of fused ops, with a torch reference for each."""
