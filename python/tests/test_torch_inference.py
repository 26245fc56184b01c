"""patch / from_hf for inference: the blocks hold their experts as moe8's
inference load does (packed, quantized codes; no f32 or bf16 copy of an
expert weight), the transformers blocks replaced are freed, and the outputs
are the training path's bytes.  Skipped with a notice where torch is
absent; the real-transformers tests skip where transformers is absent."""
import gc
import weakref

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (apt-get install python3-torch): the torch tests are skipped")
from moe8.torch import from_hf, patch  # noqa: E402

D, F, E, K, LAYERS = 64, 32, 8, 2, 2
F8 = {"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 32}]}
I8 = {"rules": [{"module_path": r"layers\.1\.", "weight_qtype": "int8", "act_qtype": "int8", "tile_size": 32}]}


class _Experts(torch.nn.Module):
    """transformers 5's fused experts: gate_up_proj [E, 2F, D] (gate rows first), down_proj [E, D, F]."""

    def __init__(self):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(E, 2 * F, D) * D ** -0.5)
        self.down_proj = torch.nn.Parameter(torch.randn(E, D, F) * F ** -0.5)


class Qwen3MoeSparseMoeBlock(torch.nn.Module):
    """A Qwen3-MoE-shaped block (softmax top-k, renormalized), transformers 5's layout."""

    def __init__(self):
        super().__init__()
        self.top_k, self.norm_topk_prob = K, True
        self.gate = torch.nn.Linear(D, E, bias=False)
        self.experts = _Experts()

    def forward(self, x):
        b, s, _ = x.shape
        x = x.reshape(-1, D)
        w, ids = torch.topk(torch.softmax(x.float() @ self.gate.weight.float().t(), -1), K, -1)
        w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for j in range(K):
            for e in range(E):
                m = ids[:, j] == e
                if m.any():
                    h = x[m] @ self.experts.gate_up_proj[e].t()
                    y = (torch.nn.functional.silu(h[:, :F]) * h[:, F:]) @ self.experts.down_proj[e].t()
                    out[m] += w[m, j:j + 1] * y
        return out.reshape(b, s, D)


CONFIG = {"model_type": "qwen3_moe", "hidden_size": D, "intermediate_size": 4 * D, "moe_intermediate_size": F, "num_experts": E,
          "num_experts_per_tok": K, "norm_topk_prob": True, "num_hidden_layers": LAYERS, "decoder_sparse_step": 1,
          "mlp_only_layers": []}


class _Model(torch.nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.config = CONFIG
        self.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"mlp": Qwen3MoeSparseMoeBlock()}) for _ in range(LAYERS)])
        self.to(dtype)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer["mlp"](x)
        return x


def _expert_sized(module, big=D * F):
    """The float32 / bfloat16 / float16 tensors of the module (parameters
    and buffers) of at least `big` elements (default: one expert's weight), by name."""
    ts = list(module.named_parameters()) + list(module.named_buffers())
    return [(n, tuple(t.shape), t.dtype) for n, t in ts if t.is_floating_point() and t.numel() >= big]


def _models(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    a = _Model(dtype)
    b = _Model(dtype)
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("rules", [None, F8, I8], ids=["f32", "f8e4m3", "int8_layer1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_inference_patch_is_the_training_paths_bytes_without_expert_copies(rules, dtype):
    train, infer = _models(dtype)
    x = torch.randn(3, 5, D).to(dtype)
    assert patch(train, rules, inference=False) == LAYERS
    infer.eval()
    assert patch(infer, rules) == LAYERS  # eval mode: the inference load
    for layer in infer.layers:
        moe = layer["mlp"].moe
        assert moe.inference_only and "inference" in repr(moe), repr(moe)
    for layer in train.layers:
        assert not layer["mlp"].moe.inference_only and "training" in repr(layer["mlp"].moe)
    assert _expert_sized(infer) == [], _expert_sized(infer)
    assert len(_expert_sized(train)) == 3 * LAYERS
    with torch.no_grad():
        want = train(x)
        got = infer(x)
    assert got.dtype == dtype
    assert torch.equal(got.view(torch.int16) if dtype == torch.bfloat16 else got, want.view(torch.int16) if dtype == torch.bfloat16
                       else want)
    # the inference path has no backward, but a forward with grad on still runs (detached)
    y = infer(x)
    assert torch.equal(y.detach().float(), got.float())


def test_patch_frees_the_blocks_it_replaces():
    model = _Model()
    refs = [weakref.ref(layer["mlp"].experts.gate_up_proj) for layer in model.layers]
    model.eval()
    patch(model)
    gc.collect()
    assert all(r() is None for r in refs)


def test_inference_blocks_refuse_to_be_copied():
    import copy
    model = _Model().eval()
    patch(model)
    with pytest.raises(TypeError, match="inference-only"):
        copy.deepcopy(model.layers[0]["mlp"].moe)


def test_from_hf_inference_needs_a_config():
    with pytest.raises(ValueError, match="config"):
        from_hf(Qwen3MoeSparseMoeBlock(), None, inference=True)


def _tiny_transformers_model(name):
    """A tiny transformers DeepSeek-V3 or GLM-4.5 causal LM in bfloat16
    (its router weight and e_score_correction_bias stay float32, as
    transformers keeps them), or a skip with a notice."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: the real-model patch tests are skipped")
    if not hasattr(transformers, "DeepseekV3ForCausalLM") or not hasattr(transformers, "Glm4MoeForCausalLM"):
        pytest.skip("this transformers has no DeepSeek-V3 / GLM-4.5 models (or no PyTorch backend): the real-model patch tests are skipped")
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                  n_group=2, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True)
    if name == "deepseek_v3":
        cfg = transformers.DeepseekV3Config(kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                                            **common)
        cls = transformers.DeepseekV3ForCausalLM
    else:
        cfg = transformers.Glm4MoeConfig(head_dim=16, **common)
        cls = transformers.Glm4MoeForCausalLM
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():  # a selection bias that matters
        for name_, buf in model.named_buffers():
            if name_.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn_like(buf) * 0.1)
    model.to(torch.bfloat16)
    # what from_pretrained(dtype=torch.bfloat16) keeps in float32 (the router
    # weight and the selection bias: _keep_in_fp32_modules_strict)
    keep = tuple(getattr(cls, "_keep_in_fp32_modules_strict", None) or ("gate.weight", "e_score_correction_bias"))
    with torch.no_grad():
        for name_, t in list(model.named_parameters()) + list(model.named_buffers()):
            if ".mlp." in name_ and any(k in name_ for k in keep):
                t.data = t.data.float()
    assert any(t.dtype == torch.float32 for n, t in model.named_parameters() if n.endswith("mlp.gate.weight"))
    return model


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
@pytest.mark.parametrize("inference", [False, True], ids=["training_path", "inference_path"])
def test_patch_bf16_transformers_models(family, inference):
    model = _tiny_transformers_model(family)
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        want = model(ids).logits.float()
        assert patch(model, inference=inference) == 1
        got = model(ids).logits
    assert got.dtype == torch.bfloat16
    err = float((got.float() - want).abs().max() / want.abs().max())
    assert err <= 2e-2, err  # bf16 noise: the block's output is rounded to bf16 where transformers rounds each product
    if inference:  # (the shared expert's, one expert wide, are kept)
        assert _expert_sized(model.model.layers[1].mlp, 8 * 32 * 64) == []
