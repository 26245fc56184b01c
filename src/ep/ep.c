/*
** ep.c — the expert-parallel object (docs/parallelism.md): creation (the
** ranks agree on the layer), destruction, and the public forward and
** backward, which hand the call to its mode: ep_ring.c (the ring of
** experts) or ep_a2a.c (the all-to-all dispatch).  What the modes share
** is ep_common.c, below both; neither mode calls this file.
*/
#include "ep_internal.h"
#include "../kernels/gmm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void moe8_ep_destroy(moe8_ep *ep) {
  if (!ep) return;
  moe8__ring_free(ep);
  moe8__a2a_free(ep);
  moe8__ep_norms_free(ep);
  free(ep->Toff);
  free(ep);
}

const moe8_ep_stats *moe8_ep_get_stats(const moe8_ep *ep) { return ep ? &ep->st : NULL; }

/* ---- create: the ranks must agree ---------------------------------------- */
#define NFP 33
typedef struct fingerprint {
  int64_t v[NFP];
} fingerprint;

static const char *const k_fp_names[NFP] = {
  "num_experts", "top_k", "hidden", "ffn", "score function", "norm_topk_prob", "routed_scaling_factor",
  "selection bias", "capacity_factor", "aux_loss_weight", "weight quantization", "weight qtype", "weight tile",
  "activation quantization", "activation qtype", "activation tile", "bwd_qtype", "quantize_before_ep_all_gather",
  "number of ranks", "n_group", "topk_group", "shared_ffn", "shared_gate", "group score", "expert form (activation, biases, input scaling)",
  "activation alpha and limit", "expert-parallel mode",
  "output form (out_bias, shared_scale, norm_p, Gemma-4's norms, rms_eps, router_norm_scale)", "router_jitter (sparsemixer)", "zero_experts", "hash routing (and its table's checksum), or scored_shared", "summation order", "weights (checksum)"};

/* The summation order as the fingerprint holds it: 1 canonical (the same
** bytes on every table), else 2 + 2·table + has_bf16 (one table's own). */
static int64_t order_code(const moe8_layer *L) {
  if (moe8_order_effective(moe8__layer_order_now(L)) == MOE8_ORDER_CANONICAL) return 1;
  const moe8__ktable *kt = moe8__kernels();
  return 2 + 2 * (int64_t)kt->isa + kt->has_bf16;
}

static void order_text(int64_t code, char *buf, size_t n) {
  if (code == 1) snprintf(buf, n, "the canonical order");
  else snprintf(buf, n, "the native order of the %s table%s", moe8_isa_name((moe8_isa)((code - 2) / 2)),
                (code - 2) % 2 ? "" : " without vdpbf16ps");
}

static uint64_t checksum(const float *p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++) h = (h ^ moe8__f32_bits(p[i])) * 0x100000001B3ULL;
  return h;
}

static fingerprint make_fp(const moe8_ep *ep) {
  const moe8_layer *L = ep->L;
  const moe8_layer_config *c = &L->cfg;
  fingerprint f = {{c->num_experts, c->top_k, c->hidden, c->ffn, c->score, c->norm_topk_prob,
                    moe8__f32_bits(c->routed_scaling_factor), c->use_selection_bias, moe8__f32_bits(c->capacity_factor),
                    moe8__f32_bits(c->aux_loss_weight), L->wq, L->wq ? L->wspec.qtype : 0, L->wq ? L->wspec.tile : 0, L->aq,
                    L->aq ? L->aspec.qtype : 0, L->aq ? L->aspec.tile : 0, L->has_rule ? L->rule.bwd_qtype : 0, L->before_sort,
                    ep->P, c->n_group, c->topk_group, c->shared_ffn, c->shared_gate, c->group_score,
                    /* in unsigned arithmetic (a shift into the sign bit is undefined), norm_eps's bits rotated by 40 */
                    (int64_t)((uint64_t)c->act + 8u * c->router_bias + 16u * c->expert_bias + 32u * c->weight_input + 64u * c->shared_plain_act +
                              128u * c->select_logits + ((uint64_t)moe8__f32_bits(c->norm_min) << 8) +
                              ((uint64_t)moe8__f32_bits(c->norm_eps) << 40 | (uint64_t)moe8__f32_bits(c->norm_eps) >> 24)),
                    (int64_t)(((uint64_t)moe8__f32_bits(c->act_alpha) << 31) ^ moe8__f32_bits(c->act_limit) ^ ((uint64_t)moe8__f32_bits(c->shared_act_limit) << 17)), ep->mode,
                    (int64_t)((uint64_t)c->out_bias ^ ((uint64_t)c->group_mask_zero << 63) ^ ((uint64_t)moe8__f32_bits(c->norm_p) << 1) ^ ((uint64_t)moe8__f32_bits(c->shared_scale) << 32) ^
                              ((uint64_t)(c->router_norm | c->expert_scale << 1 | c->in_norm << 2 | c->out_norm << 3) << 59) ^
                              ((uint64_t)moe8__f32_bits(c->rms_eps) << 13) ^ ((uint64_t)moe8__f32_bits(c->router_norm_scale) << 27)),
                    moe8__f32_bits(c->router_jitter), c->zero_experts, c->scored_shared, order_code(L), 0}};
  if (c->hash_routing) { /* the flag, the table's rows and entries */
    uint64_t th = 0xCBF29CE484222325ULL ^ (uint64_t)L->hash_vocab;
    for (int64_t i = 0; L->tid2eid && i < L->hash_vocab * c->top_k; i++) th = (th ^ (uint32_t)L->tid2eid[i]) * 0x100000001B3ULL;
    f.v[NFP - 3] = (int64_t)((th >> 2) | 1);
  }
  uint64_t h = 0xCBF29CE484222325ULL;
  for (int i = 0; i < MOE8_W_COUNT; i++)
    if (L->n[i]) h = checksum(L->w[i], L->n[i], h);
  /* Inference layers have no expert masters: their scales stand in. */
  const int64_t D = c->hidden;
  for (int s = 0; s < L->nsets && L->inference && L->wq; s++) {
    const moe8__xset *X = &L->xs[s];
    const int64_t tk = L->wspec.tile;
    h = checksum(X->wgu_s, (size_t)(X->E * (tk ? moe8__cdiv(D, tk) : 1) * X->N1), h);
    h = checksum(X->wd_s, (size_t)(X->E * (tk ? moe8__cdiv(X->F, tk) : 1) * D), h);
  }
  f.v[NFP - 1] = (int64_t)(h >> 1);
  return f;
}

moe8_status moe8_ep_create(moe8_layer *layer, moe8_comm *comm, moe8_ep **out) {
  return moe8_ep_create_ex(layer, comm, NULL, out);
}

moe8_status moe8_ep_create_ex(moe8_layer *layer, moe8_comm *comm, const moe8_ep_options *opt, moe8_ep **out) {
  if (!layer || !comm || !out) return moe8__fail(MOE8_ERR_INVALID_ARG, "ep: NULL argument");
  *out = NULL;
  moe8_ep_options o = {sizeof o, MOE8_EP_RING};
  if (opt) {
    if (opt->size < sizeof(size_t) + sizeof(moe8_ep_mode) || opt->size > ((size_t)1 << 16))
      return moe8__fail(MOE8_ERR_INVALID_ARG, "ep: moe8_ep_options.size = %zu is not a size this library knows", opt->size);
    memcpy(&o, opt, opt->size < sizeof o ? opt->size : sizeof o);
  }
  if (o.mode != MOE8_EP_RING && o.mode != MOE8_EP_ALLTOALL)
    return moe8__fail(MOE8_ERR_INVALID_ARG, "ep: unknown expert-parallel mode %d", (int)o.mode);
  if (layer->cfg.latent > 0 || layer->cfg.expert_out_norm)
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "ep: layer %s has %s: expert parallelism is not implemented for it (the single process "
                      "runs it)", layer->module_path, layer->cfg.latent > 0 ? "latent experts" : "a per-expert output norm");
  if (layer->cfg.router_mlp > 0 || layer->cfg.skip_experts > 0) /* the layer's own config: every rank refuses alike */
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "ep: layer %s has %s (Zaya's): not implemented under expert parallelism (the single process "
                      "runs it)", layer->module_path,
                      layer->cfg.router_mlp > 0 ? "an MLP router (router_mlp) carrying a router state" : "skip experts (skip_experts)");
  if (layer->cfg.product_keys) /* the layer's own config: every rank refuses alike */
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "ep: layer %s has product-key experts (Doge's): a token's routing reads other tokens' "
                      "router logits (transformers' view over the call's tokens), so a shard cannot route alone: not implemented under "
                      "expert parallelism", layer->module_path);
  if (layer->cfg.capacity_ranked || (layer->cfg.expert_bias && !moe8__act_gated(layer->cfg.act)))
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "ep: layer %s %s: not implemented under expert parallelism", layer->module_path,
                      layer->cfg.capacity_ranked ? "drops slots past its capacity (capacity_ranked, NLLB-MoE's, counted over all rows)"
                                                 : "has ungated experts with biases (expert_bias)");
  if (layer->cfg.expert_capacity > 0) /* the layer's own config: every rank refuses alike */
    return moe8__fail(MOE8_ERR_UNSUPPORTED, "ep: layer %s drops tokens past expert_capacity (SwitchTransformers', counted per sequence): "
                      "not implemented under expert parallelism", layer->module_path);
  moe8_ep *ep = calloc(1, sizeof *ep);
  if (!ep) return moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  ep->mode = o.mode;
  ep->L = layer;
  ep->c = comm;
  ep->P = comm->size;
  ep->r = comm->rank;
  /* Every rank compares every rank's fingerprint with rank 0's, so all
  ** reach the same verdict and the same message. */
  const fingerprint mine = make_fp(ep);
  fingerprint *all = malloc(sizeof(fingerprint) * (size_t)ep->P);
  size_t *rb = malloc(sizeof(size_t) * (size_t)ep->P);
  moe8_status st = all && rb ? MOE8_OK : moe8__fail(MOE8_ERR_NOMEM, "ep: out of memory");
  if (st == MOE8_OK) {
    for (int i = 0; i < ep->P; i++) rb[i] = sizeof(fingerprint);
    st = comm->allgatherv(comm, &mine, sizeof mine, all, rb);
  }
  for (int i = 1; i < ep->P && st == MOE8_OK; i++)
    for (int k = 0; k < NFP; k++)
      if (all[i].v[k] != all[0].v[k]) {
        if (k == NFP - 2) {
          char a[96], b[96];
          order_text(all[i].v[k], a, sizeof a);
          order_text(all[0].v[k], b, sizeof b);
          st = moe8__fail(MOE8_ERR_INVALID_ARG, "ep: ranks disagree on the summation order: rank %d sums in %s, rank 0 in %s "
                          "(set MOE8_ORDER=canonical on every rank, or moe8_layer_set_order)", i, a, b);
          break;
        }
        st = k == NFP - 1 ? moe8__fail(MOE8_ERR_INVALID_ARG, "ep: ranks disagree on the layer: rank %d's weights differ from rank 0's", i)
                     : moe8__fail(MOE8_ERR_INVALID_ARG, "ep: ranks disagree on the layer config: rank %d has %s = %lld, rank 0 has %lld",
                                  i, k_fp_names[k], (long long)all[i].v[k], (long long)all[0].v[k]);
        break;
      }
  free(all);
  free(rb);
  const int64_t E = layer->cfg.num_experts;
  if (st == MOE8_OK && E % ep->P != 0)
    st = moe8__fail(MOE8_ERR_SHAPE, "ep: %lld experts cannot be split evenly over %d ranks (E %% P = %lld)", (long long)E, ep->P,
                    (long long)(E % ep->P));
  if (st != MOE8_OK) { free(ep); return st; }
  ep->Eloc = E / ep->P;
  ep->g0 = ep->r * ep->Eloc;
  *out = ep;
  return MOE8_OK;
}

/* ---- the modes ------------------------------------------------------------------ */
moe8_status moe8_ep_forward_tokens(moe8_ep *ep, const float *x, int64_t Tl, const int32_t *tok, float *out, float *aux) {
  if (!ep) return moe8__fail(MOE8_ERR_INVALID_ARG, "ep: NULL");
  return ep->mode == MOE8_EP_ALLTOALL ? moe8__a2a_forward(ep, x, Tl, tok, out, aux) : moe8__ring_forward(ep, x, Tl, tok, out, aux);
}

moe8_status moe8_ep_forward(moe8_ep *ep, const float *x, int64_t Tl, float *out, float *aux) {
  return moe8_ep_forward_tokens(ep, x, Tl, NULL, out, aux);
}

moe8_status moe8_ep_backward(moe8_ep *ep, const float *x, int64_t Tl, const float *dout, const moe8_layer_grads *gr) {
  if (!ep || !gr) return moe8__fail(MOE8_ERR_INVALID_ARG, "ep backward: NULL argument");
  const moe8_status fst = moe8__check_backward_form(ep->L, "ep backward");
  if (fst != MOE8_OK) return fst;
  return ep->mode == MOE8_EP_ALLTOALL ? moe8__a2a_backward(ep, x, Tl, dout, gr) : moe8__ring_backward(ep, x, Tl, dout, gr);
}

moe8_ep_mode moe8_ep_get_mode(const moe8_ep *ep) { return ep ? ep->mode : MOE8_EP_RING; }
