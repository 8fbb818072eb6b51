"""Quantized checkpoints (issue 30, first step): which formats load, and the FP8 block linear method.

- `config.py`: `quantization_config` of config.json and `--quantization` checked against each other
  at start-up (an unsupported method refused before any weight loads).
- `fp8_block.py`: FP8 (e4m3) weights with 2-D block scales (`weight_scale_inv`, DeepSeek's format):
  block quantize / dequantize, and `Fp8BlockLinearMethod`, which a linear layer calls instead of its
  plain matmul (the weight stays in 1 byte; each call widens one tile of rows at a time).
- `fp8_load.py`: the checkpoint stream of such a checkpoint (`models/weight_loading.py` wraps it):
  a linear turns FP8 when its first FP8 tensor arrives; layers not built for FP8 get their weight
  dequantized once, at load.
"""
