"""PD disaggregation: a prefill server computes a prompt's KV and pushes it, chunk by chunk, to a
decode server that continues generation (README.md in this folder)."""
