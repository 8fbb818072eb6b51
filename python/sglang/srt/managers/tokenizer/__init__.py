"""The request side of the control plane: the tokenizer manager (main process) and the
detokenizer process (`managers/README.md`). Import from the modules; this package file imports
nothing."""
