/*
** train.c — Adam on a layer's f32 master weights (docs/layer.md).
**
** One step: forward, the mean-squared-error loss against the target plus
** the auxiliary loss, backward, then Adam (β1 0.9, β2 0.999, ε 1e-8, bias
** corrected) on Wr, Wg, Wu, Wd, the shared expert's weights and gate, and
** GPT-OSS's router and expert biases, JetMoE's output bias, Gemma-4's norm
** weights and scales, the latent experts' projections and norms.  The selection bias is not trained:
** it does not enter the weights, so it has no gradient.
*/
#include "../core/internal.h"
#include "layer_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { NTRAIN = 20 };
static const moe8_weight_id k_ids[NTRAIN] = {MOE8_W_ROUTER, MOE8_W_GATE, MOE8_W_UP, MOE8_W_DOWN,
                                             MOE8_W_SHARED_GATE, MOE8_W_SHARED_UP, MOE8_W_SHARED_DOWN, MOE8_W_SHARED_GATE_W,
                                             MOE8_W_ROUTER_BIAS, MOE8_W_GU_BIAS, MOE8_W_DOWN_BIAS, MOE8_W_OUT_BIAS,
                                             MOE8_W_ROUTER_SCALE, MOE8_W_EXPERT_SCALE, MOE8_W_IN_NORM, MOE8_W_OUT_NORM,
                                             MOE8_W_LATENT_IN, MOE8_W_LATENT_OUT, MOE8_W_LATENT_NORM, MOE8_W_EXPERT_OUT_NORM};

struct moe8_trainer {
  moe8_layer *layer;
  float       lr;
  int64_t     step;
  float      *m[NTRAIN], *v[NTRAIN], *g[NTRAIN];
  size_t      n[NTRAIN];
  float      *out, *dout;
  int64_t     cap_T;
};

void moe8_trainer_destroy(moe8_trainer *tr) {
  if (!tr) return;
  for (int i = 0; i < NTRAIN; i++) { free(tr->m[i]); free(tr->v[i]); free(tr->g[i]); }
  free(tr->out);
  free(tr->dout);
  free(tr);
}

moe8_status moe8_trainer_create(moe8_layer *layer, float lr, moe8_trainer **out) {
  if (!layer || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "trainer: NULL argument");
  if (!(lr > 0.0f && lr < 1.0f)) return moe8__fail(MOE8_ERR_INVALID_ARG, "trainer: learning rate %g is not in (0, 1)", (double)lr);
  const moe8_status fst = moe8__check_backward_form(layer, "trainer");
  if (fst != MOE8_OK) return fst;
  moe8_trainer *tr = calloc(1, sizeof *tr);
  if (!tr) return moe8__fail(MOE8_ERR_NOMEM, "trainer: out of memory");
  tr->layer = layer;
  tr->lr = lr;
  if (!moe8_layer_weight(layer, MOE8_W_UP, NULL)) {
    free(tr);
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "trainer: the layer was loaded for inference (no f32 masters)");
  }
  for (int i = 0; i < NTRAIN; i++) {
    if (!moe8_layer_weight(layer, k_ids[i], &tr->n[i])) continue;
    tr->m[i] = calloc(tr->n[i], sizeof(float));
    tr->v[i] = calloc(tr->n[i], sizeof(float));
    tr->g[i] = malloc(tr->n[i] * sizeof(float));
    if (!tr->m[i] || !tr->v[i] || !tr->g[i]) { moe8_trainer_destroy(tr); return moe8__fail(MOE8_ERR_NOMEM, "trainer: out of memory"); }
  }
  *out = tr;
  return MOE8_OK;
}

moe8_status moe8_trainer_set_lr(moe8_trainer *tr, float lr) {
  if (!tr || !(lr > 0.0f && lr < 1.0f)) return moe8__fail(MOE8_ERR_INVALID_ARG, "trainer: learning rate %g is not in (0, 1)", (double)lr);
  tr->lr = lr;
  return MOE8_OK;
}

moe8_status moe8_trainer_step(moe8_trainer *tr, const float *x, const float *target, int64_t T, float *loss, void *ws,
                              size_t ws_size) {
  return moe8_trainer_step_tokens(tr, x, NULL, target, T, loss, ws, ws_size);
}

moe8_status moe8_trainer_step_tokens(moe8_trainer *tr, const float *x, const int32_t *tok, const float *target, int64_t T, float *loss,
                                     void *ws, size_t ws_size) {
  if (!tr || !x || !target || T <= 0) return moe8__fail(MOE8_ERR_INVALID_ARG, "trainer step: NULL buffer or T <= 0");
  const int64_t D = moe8_layer_get_config(tr->layer)->hidden;
  const size_t TD = (size_t)(T * D);
  if (T > tr->cap_T) {
    float *o = realloc(tr->out, TD * sizeof(float)), *d = o ? realloc(tr->dout, TD * sizeof(float)) : NULL;
    if (o) tr->out = o;
    if (d) tr->dout = d;
    if (!o || !d) return moe8__fail(MOE8_ERR_NOMEM, "trainer step: out of memory");
    tr->cap_T = T;
  }
  float aux = 0.0f;
  moe8_status st = moe8_layer_forward_tokens(tr->layer, x, T, tok, tr->out, &aux, ws, ws_size);
  if (st != MOE8_OK) return st;
  double sse = 0.0;
  const float k = 2.0f / (float)TD;
  for (size_t i = 0; i < TD; i++) {
    const float d = tr->out[i] - target[i];
    sse += (double)d * d;
    tr->dout[i] = k * d;
  }
  if (loss) *loss = (float)(sse / (double)TD) + aux;
  const moe8_layer_grads g = {NULL, tr->g[0], tr->g[1], tr->g[2], tr->g[3], tr->g[4], tr->g[5], tr->g[6], tr->g[7], tr->g[8], tr->g[9],
                              tr->g[10], tr->g[11], tr->g[12], tr->g[13], tr->g[14], tr->g[15], tr->g[16], tr->g[17], tr->g[18],
                              tr->g[19]};
  st = moe8_layer_backward(tr->layer, x, T, tr->dout, ws, ws_size, &g);
  if (st != MOE8_OK) return st;
  tr->step++;
  const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  const float c1 = 1.0f - powf(b1, (float)tr->step), c2 = 1.0f - powf(b2, (float)tr->step);
  for (int w = 0; w < NTRAIN; w++) {
    if (!tr->n[w]) continue;
    float *p = moe8_layer_weight(tr->layer, k_ids[w], NULL), *m = tr->m[w], *v = tr->v[w];
    const float *gr = tr->g[w];
    #pragma omp parallel for num_threads(moe8__nt(10.0 * (double)tr->n[w])) schedule(static)
    for (size_t i = 0; i < tr->n[w]; i++) {
      m[i] = b1 * m[i] + (1.0f - b1) * gr[i];
      v[i] = b2 * v[i] + (1.0f - b2) * gr[i] * gr[i];
      p[i] -= tr->lr * (m[i] / c1) / (sqrtf(v[i] / c2) + eps);
    }
  }
  return MOE8_OK;
}
