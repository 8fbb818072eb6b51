// AMX tile configuration shared by the AMX kernels (prefill_attention_amx.cpp: BF16 tiles,
// int8_linear.cpp: INT8 tiles). Include it only where the AMX intrinsics are compiled in
// (-mamx-tile); callers check the CPU and the OS permission at run time before using it.
#pragma once

#include <cstdint>
#include <cstring>

#include <immintrin.h>

namespace sgl_amx {

// the 64-byte operand of ldtilecfg (palette 1)
struct alignas(64) TileConfig {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// every one of the 8 tile registers: 16 rows x 64 bytes
inline void configure_full_tiles() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int i = 0; i < 8; ++i) {
    cfg.rows[i] = 16;
    cfg.colsb[i] = 64;
  }
  // the compiler does not see ldtilecfg read cfg and drops the stores above without this
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

}  // namespace sgl_amx
