/*
** gmm_amx_emu.c — the AMX kernels of gmm_amx.c over the C model of the
** tile instructions (kernels/amx_model.h): the "amx_emu" table.
*/
#define MOE8_AMX_EMU 1
#include "gmm_amx.c"
