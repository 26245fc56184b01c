/*
** table_ref.c — fills a kernel table with the reference (scalar) kernels.
** Every ISA's table starts from this one and overrides what it has, so an
** entry an ISA lacks still works, at reference speed.
*/
#include "ref.h"
#include "../gmm.h"

static size_t no_pack(const moe8__gmm_block *b) { (void)b; return 0; }

void moe8__kernels_init_ref(moe8__ktable *k) {
  k->isa          = MOE8_ISA_REF;
  k->cvt_f32_f8   = moe8__ref_cvt_f32_f8;
  k->cvt_f8_f32   = moe8__ref_cvt_f8_f32;
  k->cvt_f8_bf16  = moe8__ref_cvt_f8_bf16;
  k->cvt_f32_bf16 = moe8__ref_cvt_f32_bf16;
  k->cvt_bf16_f32 = moe8__ref_cvt_bf16_f32;
  k->cvt_f32_i8   = moe8__ref_cvt_f32_i8;
  k->absmax       = moe8__ref_absmax;
  k->absmax_acc   = moe8__ref_absmax_acc;
  k->quant_div    = moe8__ref_quant_div;
  k->dequant      = moe8__ref_dequant;
  k->swiglu       = moe8__ref_swiglu;
  k->swiglu_clamp = moe8__ref_swiglu_clamp;
  k->swiglu_limit = moe8__ref_swiglu_limit;
  k->swiglu_post  = moe8__ref_swiglu_post;
  k->swiglu_softcap = moe8__ref_swiglu_softcap;
  k->geglu        = moe8__ref_geglu;
  k->relu2        = moe8__ref_relu2;
  k->relu         = moe8__ref_relu;
  k->mx4_rows     = moe8__ref_mx4_rows;
  k->mx4_rows_i8  = moe8__ref_mx4_rows_i8;
  k->router_logits = moe8__ref_router_logits;
  k->gmm_block    = moe8__gmm_block_ref;
  k->gmm_pack_size = no_pack;
  k->gmm_pack     = NULL;
}
