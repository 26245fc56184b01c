/*
** peak_amx.c — the AMX tile units' peak (tdpbf16ps, tdpbssd), measured with
** four independent C tiles per loop.  Compiled with the AMX flags; called
** only where the amx table is supported (the library has then been given
** the tile permission for the process).
*/
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

double cli_now(void);
double peak_amx(int int8, long iters);

double peak_amx(int int8, long iters) {
  struct { uint8_t palette, start, res[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int i = 0; i < 8; i++) { cfg.colsb[i] = 64; cfg.rows[i] = 16; }
  static uint8_t buf[1024] __attribute__((aligned(64)));
  _tile_loadconfig(&cfg);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  _tile_loadd(4, buf, 64); _tile_loadd(5, buf, 64); _tile_loadd(6, buf, 64); _tile_loadd(7, buf, 64);
  const double t0 = cli_now();
  if (int8)
    for (long n = 0; n < iters; n++) { _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7); _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7); }
  else
    for (long n = 0; n < iters; n++) { _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
  const double t = cli_now() - t0;
  _tile_stored(0, buf, 64);
  _tile_release();
  /* per instruction: 16 x 16 outputs of 32 bf16 (or 64 i8) products, 2 ops each */
  return (double)iters * 4 * 16 * 16 * (int8 ? 64 : 32) * 2 / t / 1e9;
}
