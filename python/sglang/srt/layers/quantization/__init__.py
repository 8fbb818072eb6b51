"""Quantized checkpoints (issue 30): which formats load, and the methods that run them.

- `config.py`: `quantization_config` of config.json and `--quantization` checked against each other
  at start-up (an unsupported method or scheme refused before any weight loads).
- `fp8_block.py`: FP8 (e4m3) weights with 2-D block scales (`weight_scale_inv`, DeepSeek's format):
  block quantize / dequantize, and `Fp8BlockLinearMethod`, which a linear layer calls instead of its
  plain matmul (the weight stays in 1 byte; each call widens one tile of rows at a time).
- `fp8_moe.py`: the same for routed experts (`Fp8BlockMoEMethod`, called by `FusedMoE`).
- `w8a8_int8.py`: W8A8-INT8 (int8 weights with per-channel scales, activations quantized per token
  at run time; SGLang's `w8a8_int8` and compressed-tensors' int8 format): `W8A8Int8LinearMethod`
  (int8 x int8 -> int32 GEMM from the kernel dispatch table); `w8a8_moe.py` the same for routed
  experts; `w8a8_load.py` its checkpoint stream; `online.py` `--quantization w8a8_int8` on an
  unquantized checkpoint (decoder linears and experts quantized after loading).
- `checkpoint_stream.py`: the checkpoint stream shared by the formats: a linear (or a FusedMoE)
  turns quantized when its first quantized tensor arrives; modules not built for the format get
  their weight dequantized once, at load. `fp8_load.py`: its FP8 form; `loading.py`: the one entry
  `models/weight_loading.py` calls.
"""
