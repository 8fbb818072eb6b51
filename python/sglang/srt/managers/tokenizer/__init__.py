"""The request side of the control plane: the tokenizer manager (main process) and the detokenizer
process (README.md one level up)."""
