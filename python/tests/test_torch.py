"""The PyTorch module: gradients against a plain PyTorch block, FP8 bytes
against moe8's own C results, and a small model that trains.  Skipped with
a notice where torch is absent."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (apt-get install python3-torch): the torch tests are skipped")
from moe8.torch import MoE8Block  # noqa: E402

import moe8  # noqa: E402


def plain_block(x, router, gate, up, down, k, norm):
    """The same f32 MoE block in plain PyTorch (autograd does the backward)."""
    p = torch.softmax(x @ router, dim=-1)
    w, ids = torch.topk(p, k, dim=-1)
    if norm:
        w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for j in range(k):
        for e in range(router.shape[1]):
            m = ids[:, j] == e
            if m.any():
                h = torch.nn.functional.silu(x[m] @ gate[e]) * (x[m] @ up[e])
                out = out.index_add(0, m.nonzero().squeeze(1), w[m, j:j + 1] * (h @ down[e]))
    return out


def rel(a, b):
    return float((a - b).norm() / b.norm())


def test_gradients_match_plain_pytorch():
    torch.manual_seed(0)
    blk = MoE8Block(hidden=32, ffn=24, num_experts=6, top_k=2, seed=3)
    x = torch.randn(11, 32, requires_grad=True)
    y = blk(x)
    r = torch.randn_like(y)
    (y * r).sum().backward()
    ref_p = {n: getattr(blk, n).detach().clone().requires_grad_(True) for n in ("router", "gate", "up", "down")}
    xr = x.detach().clone().requires_grad_(True)
    yr = plain_block(xr, ref_p["router"], ref_p["gate"], ref_p["up"], ref_p["down"], 2, True)
    (yr * r).sum().backward()
    assert rel(y.detach(), yr.detach()) <= 1e-5
    assert rel(x.grad, xr.grad) <= 1e-5
    for n in ("router", "gate", "up", "down"):
        assert rel(getattr(blk, n).grad, ref_p[n].grad) <= 1e-5, n


def test_fp8_bytes_equal_the_c_layer():
    rules = {"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 32}]}
    blk = MoE8Block(hidden=64, ffn=32, num_experts=4, top_k=2, rules=rules, seed=5)
    x = torch.randn(9, 64)
    y = blk(x)
    L = moe8.Layer(num_experts=4, top_k=2, hidden=64, ffn=32, norm_topk_prob=True, rules=rules, module_path="model.layers.0.mlp.experts")
    L.init_random(5)
    want, _ = L.forward(x.numpy())
    assert y.detach().numpy().tobytes() == want.tobytes()


def test_two_layer_model_trains():
    torch.manual_seed(1)

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(16, 32)
            self.moe1 = MoE8Block(hidden=32, ffn=32, num_experts=4, top_k=2, seed=1)
            self.moe2 = MoE8Block(hidden=32, ffn=32, num_experts=4, top_k=2, seed=2)
            self.out = torch.nn.Linear(32, 4)

        def forward(self, x):
            h = self.inp(x)
            h = h + self.moe1(h)
            h = h + self.moe2(h)
            return self.out(h)

    model = Toy()
    x = torch.randn(128, 16)
    target = torch.randn(128, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(100):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0], losses[::10]


def test_parameters_that_come_apart_are_refused():
    x = torch.randn(4, 16)
    for change in (lambda b: b.double(), lambda b: b.half(), lambda b: setattr(b.gate, "data", b.gate.data.clone()),
                   lambda b: b.share_memory()):
        block = MoE8Block(hidden=16, ffn=8, num_experts=4, top_k=2)
        block(x)
        change(block)
        with pytest.raises((RuntimeError, TypeError), match="moe8"):
            block(x if next(block.parameters()).dtype == torch.float32 else x.to(next(block.parameters()).dtype))
    # in-place writes are the layer's memory: they reach the output
    block = MoE8Block(hidden=16, ffn=8, num_experts=4, top_k=2)
    y0 = block(x).detach().clone()
    with torch.no_grad():
        block.down.mul_(2.0)
    assert not torch.allclose(block(x), y0)


def test_input_width_is_checked():
    block = MoE8Block(hidden=16, ffn=8, num_experts=4, top_k=2)
    with pytest.raises(ValueError, match="hidden = 16"):
        block(torch.randn(4, 8))


def test_parameter_outlives_its_block():
    block = MoE8Block(hidden=16, ffn=8, num_experts=4, top_k=2)
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    p = block.gate
    del block
    import gc
    gc.collect()
    s = float(p.sum())  # still the layer's memory, kept alive by the tensor
    p.grad = torch.ones_like(p)
    opt.step()
    assert float(p.sum()) != s


def test_inference_path_bf16_repr_pickle():
    import copy
    import io
    import pickle
    rules = {"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 16}]}
    block = MoE8Block(hidden=32, ffn=16, num_experts=4, top_k=2, rules=rules, shared_ffn=8)
    x = torch.randn(5, 32)
    y = block(x)                      # autograd path
    with torch.no_grad():
        z = block(x)                  # the prepared, fused path: the same bytes
    assert torch.equal(y.detach(), z)
    with torch.no_grad():
        block.down.mul_(0.5)          # an in-place change: re-prepared
        z2 = block(x)
    assert not torch.equal(z, z2)
    assert torch.equal(block(x).detach(), z2)
    yb = block(x.bfloat16())
    assert yb.dtype == torch.bfloat16 and yb.shape == x.shape
    assert "hidden=32" in repr(block) and "num_experts=4" in repr(block)
    for clone in (copy.deepcopy(block), pickle.loads(pickle.dumps(block))):
        assert clone.layer is not block.layer
        assert torch.equal(clone(x).detach(), block(x).detach())
    buf = io.BytesIO()
    torch.save(block, buf)
    buf.seek(0)
    again = torch.load(buf, weights_only=False)
    assert torch.equal(again(x).detach(), block(x).detach())


def test_from_pretrained(tmp_path):
    import json
    import os
    import subprocess
    bin_ = os.environ.get("MOE8_BIN", "moe8")
    (tmp_path / "cfg.json").write_text(json.dumps({"model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2, "hidden_size": 64,
                                                   "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
                                                   "num_hidden_layers": 1}))
    subprocess.run([bin_, "init", "--config", str(tmp_path / "cfg.json"), "--out", str(tmp_path / "m")], check=True, capture_output=True)
    block = MoE8Block.from_pretrained(str(tmp_path / "m"))
    x = torch.randn(6, 64)
    want, _ = moe8.Layer.from_model(str(tmp_path / "m"), mode="training").forward(x.numpy())
    assert torch.equal(block(x).detach(), torch.from_numpy(want))
    loss = block(x).square().sum()
    loss.backward()
    assert block.gate.grad is not None and block.gate.grad.abs().sum() > 0


# ---- transformers-shaped blocks, written here from the reference code ---------------------
class _MLP(torch.nn.Module):
    def __init__(self, D, F, names=("gate_proj", "up_proj", "down_proj")):
        super().__init__()
        self.names = names
        setattr(self, names[0], torch.nn.Linear(D, F, bias=False))
        setattr(self, names[1], torch.nn.Linear(D, F, bias=False))
        setattr(self, names[2], torch.nn.Linear(F, D, bias=False))

    def forward(self, x):
        g, u, d = (getattr(self, n) for n in self.names)
        return d(torch.nn.functional.silu(g(x)) * u(x))


class Qwen2MoeSparseMoeBlock(torch.nn.Module):
    """The Hugging Face Qwen2-MoE block's computation (4.x layout)."""

    def __init__(self, D=32, F=16, E=6, k=2, Fs=24, norm=False):
        super().__init__()
        self.num_experts, self.top_k, self.norm_topk_prob = E, k, norm
        self.gate = torch.nn.Linear(D, E, bias=False)
        self.experts = torch.nn.ModuleList([_MLP(D, F) for _ in range(E)])
        self.shared_expert = _MLP(D, Fs)
        self.shared_expert_gate = torch.nn.Linear(D, 1, bias=False)

    def forward(self, hidden_states):
        b, s, D = hidden_states.shape
        x = hidden_states.reshape(-1, D)
        logits = self.gate(x)
        p = torch.softmax(logits, dim=1, dtype=torch.float)
        w, ids = torch.topk(p, self.top_k, dim=-1)
        if self.norm_topk_prob:
            w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(self.num_experts):
            for j in range(self.top_k):
                m = ids[:, j] == e
                if m.any():
                    out[m] += w[m, j:j + 1] * self.experts[e](x[m])
        out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(b, s, D), logits


class MixtralSparseMoeBlock(torch.nn.Module):
    def __init__(self, D=32, F=16, E=4, k=2):
        super().__init__()
        self.top_k = k
        self.gate = torch.nn.Linear(D, E, bias=False)
        self.experts = torch.nn.ModuleList([_MLP(D, F, ("w1", "w3", "w2")) for _ in range(E)])

    def forward(self, hidden_states):
        b, s, D = hidden_states.shape
        x = hidden_states.reshape(-1, D)
        logits = self.gate(x)
        w, ids = torch.topk(torch.softmax(logits, dim=1, dtype=torch.float), self.top_k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(len(self.experts)):
            for j in range(self.top_k):
                m = ids[:, j] == e
                if m.any():
                    out[m] += w[m, j:j + 1] * self.experts[e](x[m])
        return out.reshape(b, s, D), logits


class Qwen3NextSparseMoeBlock(Qwen2MoeSparseMoeBlock):
    """Qwen3-Next's block: Qwen2-MoE's, renormalized (its config's default)."""

    def __init__(self):
        super().__init__(norm=True)


class DeepseekV2Moe(torch.nn.Module):
    """DeepSeek-V2's block (transformers 5 layout: returns the hidden states
    only): softmax, group_limited_greedy by the group's best score, weights
    times routed_scaling_factor, ungated shared experts."""

    def __init__(self, D=32, F=16, E=8, k=2, n_group=4, topk_group=2, scale=2.0):
        super().__init__()
        self.top_k, self.num_group, self.topk_group, self.routed_scaling_factor = k, n_group, topk_group, scale
        self.topk_method, self.norm_topk_prob = "group_limited_greedy", False
        self.gate = torch.nn.Linear(D, E, bias=False)
        self.experts = torch.nn.ModuleList([_MLP(D, F) for _ in range(E)])
        self.shared_experts = _MLP(D, 2 * F)

    def forward(self, hidden_states):
        b, s, D = hidden_states.shape
        x = hidden_states.reshape(-1, D)
        p = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        E = p.shape[1]
        gs = p.view(-1, self.num_group, E // self.num_group).max(dim=-1).values
        keep = torch.zeros_like(gs).scatter_(1, torch.topk(gs, self.topk_group, dim=-1)[1], 1)
        mask = keep.unsqueeze(-1).expand(-1, self.num_group, E // self.num_group).reshape(-1, E)
        w, ids = torch.topk(p.masked_fill(~mask.bool(), 0.0), self.top_k, dim=-1)
        w = w * self.routed_scaling_factor
        out = torch.zeros_like(x)
        for e in range(E):
            for j in range(self.top_k):
                m = ids[:, j] == e
                if m.any():
                    out[m] += w[m, j:j + 1] * self.experts[e](x[m])
        return (out + self.shared_experts(x)).reshape(b, s, D)


class _GptOssRouter(torch.nn.Module):
    def __init__(self, D, E, k):
        super().__init__()
        self.top_k = k
        self.weight = torch.nn.Parameter(torch.randn(E, D) * D ** -0.5)
        self.bias = torch.nn.Parameter(torch.randn(E) * 0.5)


class _GptOssExperts(torch.nn.Module):
    def __init__(self, D, F, E):
        super().__init__()
        self.alpha, self.limit = 1.702, 1.0
        self.gate_up_proj = torch.nn.Parameter(torch.randn(E, D, 2 * F) * D ** -0.5 * 3)
        self.gate_up_proj_bias = torch.nn.Parameter(torch.randn(E, 2 * F) * 0.5)
        self.down_proj = torch.nn.Parameter(torch.randn(E, F, D) * F ** -0.5)
        self.down_proj_bias = torch.nn.Parameter(torch.randn(E, D) * 0.2)


class GptOssMLP(torch.nn.Module):
    """transformers' GPT-OSS block: router bias, top-k then softmax, expert
    biases, gate/up in alternate columns, the clamped SwiGLU."""

    def __init__(self, D=32, F=16, E=8, k=2):
        super().__init__()
        self.router = _GptOssRouter(D, E, k)
        self.experts = _GptOssExperts(D, F, E)

    def forward(self, hidden_states):
        b, s, D = hidden_states.shape
        x = hidden_states.reshape(-1, D)
        logits = x @ self.router.weight.t() + self.router.bias
        top, ids = torch.topk(logits, self.router.top_k, dim=-1)
        w = torch.softmax(top, dim=1)
        ex = self.experts
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                e = int(ids[t, j])
                gu = x[t] @ ex.gate_up_proj[e] + ex.gate_up_proj_bias[e]
                g, u = gu[0::2].clamp(max=ex.limit), gu[1::2].clamp(-ex.limit, ex.limit)
                h = (u + 1) * (g * torch.sigmoid(g * ex.alpha))
                out[t] += w[t, j] * (h @ ex.down_proj[e] + ex.down_proj_bias[e])
        return out.reshape(b, s, D), torch.zeros_like(logits).scatter_(1, ids, w)


class _Llama4Experts(torch.nn.Module):
    def __init__(self, D, F, E):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(E, D, 2 * F) * D ** -0.5)
        self.down_proj = torch.nn.Parameter(torch.randn(E, F, D) * F ** -0.5)


class Llama4TextMoe(torch.nn.Module):
    """transformers' Llama-4 block: the sigmoid of each chosen router logit
    scales that expert's input; the ungated shared expert added."""

    def __init__(self, D=32, F=16, E=8, k=1):
        super().__init__()
        self.top_k = k
        self.router = torch.nn.Linear(D, E, bias=False)
        self.experts = _Llama4Experts(D, F, E)
        self.shared_expert = _MLP(D, F)

    def forward(self, hidden_states):
        b, s, D = hidden_states.shape
        x = hidden_states.reshape(-1, D)
        logits = self.router(x)
        top, ids = torch.topk(logits, self.top_k, dim=1)
        scores = torch.sigmoid(torch.full_like(logits, float("-inf")).scatter_(1, ids, top))
        out = self.shared_expert(x)
        F = self.experts.gate_up_proj.shape[2] // 2
        for e in range(logits.shape[1]):
            h = (x * scores[:, e:e + 1]) @ self.experts.gate_up_proj[e]
            out = out + (torch.nn.functional.silu(h[:, :F]) * h[:, F:]) @ self.experts.down_proj[e]
        return out.reshape(b, s, D), logits


class _FusedExperts(torch.nn.Module):
    """transformers 5's experts: gate_up_proj [E, 2F, D] (gate rows first), down_proj [E, D, F]."""

    def __init__(self, D, F, E):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(E, 2 * F, D) * D ** -0.5)
        self.down_proj = torch.nn.Parameter(torch.randn(E, D, F) * F ** -0.5)

    def expert(self, e, x):
        F = self.down_proj.shape[2]
        h = x @ self.gate_up_proj[e].t()
        return (torch.nn.functional.silu(h[:, :F]) * h[:, F:]) @ self.down_proj[e].t()


class _BiasRouter(torch.nn.Module):
    def __init__(self, D, E, k, bias=True):
        super().__init__()
        self.top_k = k
        self.weight = torch.nn.Parameter(torch.randn(E, D) * D ** -0.5)
        if bias:
            self.register_buffer("e_score_correction_bias", torch.randn(E) * 0.5 - 1.5)


def _sigmoid_bias_route(x, weight, bias, k, n_group=1, topk_group=1):
    """sigmoid scores; the top-k of score + bias (in the topk_group best
    groups by their top-2 sums); the chosen scores."""
    s = torch.sigmoid(x @ weight.t())
    sel = s + bias
    if n_group > 1:
        T, E = sel.shape
        gs = sel.view(T, n_group, E // n_group).topk(2, dim=-1)[0].sum(dim=-1)
        keep = torch.zeros_like(gs).scatter_(1, torch.topk(gs, topk_group, dim=-1)[1], 1)
        mask = keep.unsqueeze(-1).expand(-1, n_group, E // n_group).reshape(T, E)
        sel = sel.masked_fill(~mask.bool(), float("-inf"))
    ids = torch.topk(sel, k, dim=-1)[1]
    return ids, s.gather(1, ids)


class Dots1MoE(torch.nn.Module):
    """dots.llm1's block (DeepseekV3MoE, transformers 5: the routing settings
    on the block, fused experts): here without renormalization, scaling 1.0
    (Dots1Config's defaults), 4 groups of which 2 are kept."""

    def __init__(self, D=32, F=16, E=8, k=2):
        super().__init__()
        self.top_k, self.n_group, self.topk_group, self.norm_topk_prob, self.routed_scaling_factor = k, 4, 2, False, 1.0
        self.gate = _BiasRouter(D, E, k)
        self.experts = _FusedExperts(D, F, E)
        self.shared_experts = _MLP(D, 2 * F)

    def forward(self, hidden_states):
        b, s, D = hidden_states.shape
        x = hidden_states.reshape(-1, D)
        ids, w = _sigmoid_bias_route(x, self.gate.weight, self.gate.e_score_correction_bias, self.top_k, self.n_group, self.topk_group)
        out = self.shared_experts(x)
        for e in range(self.gate.weight.shape[0]):
            for j in range(self.top_k):
                m = ids[:, j] == e
                if m.any():
                    out[m] = out[m] + w[m, j:j + 1] * self.routed_scaling_factor * self.experts.expert(e, x[m])
        return out.reshape(b, s, D)


class MiniMaxM2SparseMoeBlock(torch.nn.Module):
    """MiniMax-M2's block: sigmoid scores, the choice by score + the block's
    e_score_correction_bias, the chosen scores renormalized."""

    def __init__(self, D=32, F=16, E=8, k=3):
        super().__init__()
        self.gate = _BiasRouter(D, E, k, bias=False)
        self.experts = _FusedExperts(D, F, E)
        self.register_buffer("e_score_correction_bias", torch.randn(E) * 0.5 - 1.0)

    def forward(self, hidden_states):
        b, s, D = hidden_states.shape
        x = hidden_states.reshape(-1, D)
        ids, w = _sigmoid_bias_route(x, self.gate.weight, self.e_score_correction_bias, self.gate.top_k)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(self.gate.weight.shape[0]):
            for j in range(self.gate.top_k):
                m = ids[:, j] == e
                if m.any():
                    out[m] = out[m] + w[m, j:j + 1] * self.experts.expert(e, x[m])
        return out.reshape(b, s, D)


class _Model(torch.nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"mlp": b}) for b in blocks])

    def forward(self, x):
        for l in self.layers:
            y = l["mlp"](x)
            x = x + (y[0] if isinstance(y, tuple) else y)
        return x


def test_patch_transformers_shaped_model():
    from moe8.torch import patch
    torch.manual_seed(0)
    model = _Model([Qwen2MoeSparseMoeBlock(norm=False), Qwen2MoeSparseMoeBlock(norm=True), MixtralSparseMoeBlock(),
                    Qwen3NextSparseMoeBlock(), DeepseekV2Moe(), GptOssMLP(), Llama4TextMoe(), Llama4TextMoe(k=2), Dots1MoE(),
                    MiniMaxM2SparseMoeBlock()])
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        want = model(x)
        assert patch(model) == 10
        got = model(x)
    assert rel(got, want) <= 1e-5, rel(got, want)
    assert type(model.layers[0]["mlp"]).__name__ == "_HFBlock"


def test_patch_matches_each_blocks_own_path():
    """patch matches the rules against each block's own experts path
    (layers.N.mlp.experts), not the first layer's for every block."""
    from moe8.torch import patch

    def rule(path):
        return {"rules": [{"module_path": path, "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 16}]}

    def described(model):
        return [l["mlp"].moe.layer.describe().split()[1].rstrip(",") for l in model.layers]  # "weights f8e4m3 [...]"

    def blocks():
        torch.manual_seed(1)
        return [Qwen2MoeSparseMoeBlock(), MixtralSparseMoeBlock(), GptOssMLP(), Llama4TextMoe()]

    f8, f32 = "f8e4m3", "f32"
    for path, want in ((r"layers\.1\.", [f32, f8, f32, f32]), (r"layers\.0\.", [f8, f32, f32, f32]),
                       (r"layers\.[23]\.mlp\.experts$", [f32, f32, f8, f8])):
        model = _Model(blocks())
        assert patch(model, rule(path)) == 4
        assert described(model) == want, (path, described(model))
        assert [l["mlp"].moe._module_path for l in model.layers] == ["layers.%d.mlp.experts" % i for i in range(4)]


def test_patch_real_transformers_classes():
    try:
        import transformers  # noqa: F401
        from transformers.models.qwen2_moe.configuration_qwen2_moe import Qwen2MoeConfig
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock as HF
    except Exception:
        pytest.skip("transformers is not installed: the real-class patch test is skipped (the shaped-model test ran)")
    from moe8.torch import from_hf
    cfg = Qwen2MoeConfig(hidden_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=6,
                         num_experts_per_tok=2, norm_topk_prob=False)
    blk = HF(cfg).float().eval()
    with torch.no_grad():  # transformers 5's experts start as torch.empty (from_pretrained fills them): fill every weight
        for p in blk.parameters():
            p.normal_(0, 0.2)
    x = torch.randn(1, 7, 32)
    with torch.no_grad():
        r = blk(x)
        want = r[0] if isinstance(r, tuple) else r
        got = from_hf(blk, cfg)(x.reshape(-1, 32)).reshape(1, 7, 32)
    assert rel(got, want) <= 1e-5


def _same_grads_of_the_input(ref, blk, T=6, D=32):
    """Runs the transformers-shaped block and its moe8 block forward and
    backward on the same tokens: outputs and input gradients agree."""
    x = torch.randn(1, T, D)
    xr = x.clone().requires_grad_(True)
    want, _ = ref(xr)
    want.sum().backward()
    xm = x.clone().reshape(T, D).requires_grad_(True)
    got = blk(xm)
    assert rel(got.reshape(1, T, D), want) <= 1e-5
    got.sum().backward()
    assert rel(xm.grad.reshape(1, T, D), xr.grad) <= 1e-4, rel(xm.grad.reshape(1, T, D), xr.grad)


def test_gpt_oss_block_gradients_match_plain_pytorch():
    """from_hf of a GPT-OSS block: moe8's backward (the biases and the
    clamp included) gives plain PyTorch's gradients of the same block."""
    from moe8.torch import from_hf
    torch.manual_seed(3)
    ref = GptOssMLP()
    blk = from_hf(ref)
    _same_grads_of_the_input(ref, blk)
    assert rel(blk.router_bias.grad, ref.router.bias.grad) <= 1e-4
    gub = ref.experts.gate_up_proj_bias.grad
    assert rel(blk.gate_up_bias.grad, torch.cat([gub[:, 0::2], gub[:, 1::2]], dim=1)) <= 1e-4
    assert rel(blk.down_bias.grad, ref.experts.down_proj_bias.grad) <= 1e-4
    assert rel(blk.down.grad, ref.experts.down_proj.grad) <= 1e-4
    assert rel(blk.gate.grad, ref.experts.gate_up_proj.grad[:, :, 0::2]) <= 1e-4
    assert rel(blk.up.grad, ref.experts.gate_up_proj.grad[:, :, 1::2]) <= 1e-4


def test_sigmoid_bias_blocks_one_by_one():
    """dots.llm1 (group-limited, no renormalization) and MiniMax-M2 (the
    block's bias, renormalized) each against its own forward, and
    MiniMax-M2's input gradients against plain PyTorch's."""
    from moe8.torch import from_hf
    torch.manual_seed(11)
    for ref in (Dots1MoE(), MiniMaxM2SparseMoeBlock()):
        x = torch.randn(1, 9, 32)
        with torch.no_grad():
            assert rel(from_hf(ref)(x.reshape(-1, 32)).reshape(1, 9, 32), ref(x)) <= 1e-5
    ref = MiniMaxM2SparseMoeBlock()
    blk = from_hf(ref)
    x = torch.randn(1, 6, 32)
    xr = x.clone().requires_grad_(True)
    ref(xr).sum().backward()
    xm = x.clone().reshape(6, 32).requires_grad_(True)
    blk(xm).sum().backward()
    assert rel(xm.grad.reshape(1, 6, 32), xr.grad) <= 1e-4


def test_llama4_block_gradients_match_plain_pytorch():
    """from_hf of a Llama-4 block (top-2 here): moe8's backward through the
    input-scaling routing gives plain PyTorch's gradients."""
    from moe8.torch import from_hf
    torch.manual_seed(5)
    ref = Llama4TextMoe(k=2)
    blk = from_hf(ref)
    _same_grads_of_the_input(ref, blk)
    assert rel(blk.router.grad, ref.router.weight.grad.t()) <= 1e-4
    F = blk.gate.shape[2]
    assert rel(blk.gate.grad, ref.experts.gate_up_proj.grad[:, :, :F]) <= 1e-4
    assert rel(blk.down.grad, ref.experts.down_proj.grad) <= 1e-4
    assert rel(blk.shared_down.grad, ref.shared_expert.down_proj.weight.grad.t()) <= 1e-4


@pytest.mark.parametrize("rules", [None, {"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn",
                                                      "tile_size": 16}]}])
def test_writes_through_data_reach_the_prepared_experts(rules):
    """`p.data` carries a version counter of its own, so writes through it
    (p.data.copy_, p.data.mul_) must still re-prepare the quantized, packed
    experts: the inference path gives the bytes of the autograd path and of
    a new block holding the new weights, never a mix of old and new."""
    torch.manual_seed(3)
    block = MoE8Block(hidden=32, ffn=16, num_experts=4, top_k=2, rules=rules, shared_ffn=8)
    x = torch.randn(7, 32)
    with torch.no_grad():
        block(x)                                   # prepared here
    block.down.data.copy_(torch.randn_like(block.down))
    block.gate.data.mul_(-1.5)
    block.router.data.copy_(torch.randn_like(block.router))
    block.shared_up.data.add_(0.25)
    with torch.no_grad():
        z = block(x)
    fresh = MoE8Block(hidden=32, ffn=16, num_experts=4, top_k=2, rules=rules, shared_ffn=8)
    with torch.no_grad():
        for n in block.param_names:
            getattr(fresh, n).copy_(getattr(block, n))
        want = fresh(x)
    assert torch.equal(z, want), rel(z, want)
    assert torch.equal(block(x).detach(), want)    # the autograd path agrees
    # a write through a layer.weight() view reaches it too
    block.layer.weight("up")[:] *= 0.5
    with torch.no_grad():
        fresh.up.mul_(0.5)
        assert torch.equal(block(x), fresh(x))


def test_rules_fifo_is_refused_not_waited_on(tmp_path):
    """A rules path that is a FIFO: MoE8Block(rules=), from_pretrained and
    patch refuse it by name (they used to open it first, and hang)."""
    import os
    import subprocess
    import sys
    fifo = tmp_path / "rules.fifo"
    os.mkfifo(fifo)
    child = """
import sys
sys.path[:0] = [%r, %r]
import moe8
from moe8.torch import MoE8Block, patch
from test_torch import _Model, Qwen2MoeSparseMoeBlock
fifo = %r
calls = (lambda: MoE8Block(hidden=16, ffn=8, num_experts=4, top_k=2, rules=fifo),
         lambda: MoE8Block.from_pretrained(%r, rules=fifo),
         lambda: patch(_Model([Qwen2MoeSparseMoeBlock()]), rules=fifo))
for call in calls:
    try:
        call()
        print("accepted")
    except moe8.Error as e:
        print(e)
""" % (os.path.dirname(os.path.dirname(os.path.abspath(moe8.__file__))), os.path.dirname(os.path.abspath(__file__)), str(fifo),
       str(tmp_path / "no-model"))
    try:
        r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("a FIFO as the rules path blocked")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 3, (r.stdout, r.stderr)
    for line in lines:
        assert "rules.fifo" in line and "FIFO" in line, line


def _init_model(tmp_path, name, config):
    import json
    import os
    import subprocess
    (tmp_path / (name + ".json")).write_text(json.dumps(config))
    subprocess.run([os.environ.get("MOE8_BIN", "moe8"), "init", "--config", str(tmp_path / (name + ".json")), "--out", str(tmp_path / name)],
                   check=True, capture_output=True)
    return str(tmp_path / name)


def _llama4_model(d, E, D, F):
    """A Llama-4 checkpoint in its own names (feed_forward.router,
    experts.gate_up_proj / down_proj, shared_expert), f32."""
    import json
    import struct
    rng = np.random.default_rng(4)
    p = "model.layers.0.feed_forward."
    t = {p + "router.weight": rng.standard_normal((E, D)) * D ** -0.5, p + "experts.gate_up_proj": rng.standard_normal((E, D, 2 * F)) * D ** -0.5,
         p + "experts.down_proj": rng.standard_normal((E, F, D)) * F ** -0.5,
         p + "shared_expert.gate_proj.weight": rng.standard_normal((F, D)) * D ** -0.5,
         p + "shared_expert.up_proj.weight": rng.standard_normal((F, D)) * D ** -0.5,
         p + "shared_expert.down_proj.weight": rng.standard_normal((D, F)) * F ** -0.5}
    header, blobs, off = {}, [], 0
    for name in sorted(t):
        raw = np.ascontiguousarray(t[name], dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(t[name].shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    d.mkdir()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    (d / "config.json").write_text(json.dumps({"model_type": "llama4_text", "num_local_experts": E, "hidden_size": D,
                                               "intermediate_size": F, "intermediate_size_mlp": 2 * F, "num_hidden_layers": 1,
                                               "hidden_act": "silu"}))
    return str(d)


def test_copies_of_pretrained_blocks_keep_their_quantization(tmp_path):
    """deepcopy and pickle of a from_pretrained block run as the original
    does, byte for byte: an FP8 checkpoint without rules (its codes' format
    and the activations it was made for), and rules on the Mixtral
    (block_sparse_moe) and Llama-4 (feed_forward) paths."""
    import copy
    import pickle
    fp8 = {"rules": [{"module_path": ".*", "weight_qtype": "float8_e4m3fn", "act_qtype": "float8_e4m3fn", "tile_size": 32}]}
    # (DeepSeek's 128 x 128 blocks: the layer's K widths add up to at least 128)
    qwen = _init_model(tmp_path, "qwen", {"model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2, "hidden_size": 64,
                                          "moe_intermediate_size": 64, "shared_expert_intermediate_size": 32, "num_hidden_layers": 1})
    mixtral = _init_model(tmp_path, "mixtral", {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
                                                "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2})
    llama4 = _llama4_model(tmp_path / "llama4", E=4, D=64, F=32)
    moe8.quantize_model(qwen, str(tmp_path / "qwen_ds"), fp8, format="deepseek")
    moe8.quantize_model(mixtral, str(tmp_path / "mixtral_moe8"), fp8, format="moe8")

    def rule(path, act="int8"):
        return {"rules": [{"module_path": path, "weight_qtype": "int8", "act_qtype": act, "tile_size": 32,
                           "weight_calibration_method": "absmax,0.9"}]}

    cases = [(str(tmp_path / "qwen_ds"), None, None), (str(tmp_path / "mixtral_moe8"), None, 1),
             (str(tmp_path / "mixtral_moe8"), rule(r"block_sparse_moe\.experts", None), None),
             (mixtral, rule(r"layers\.1\.block_sparse_moe"), 1), (llama4, rule(r"feed_forward\.experts$"), None)]
    x = torch.randn(9, 64)
    for model_dir, rules, layer in cases:
        block = MoE8Block.from_pretrained(model_dir, layer=layer, rules=rules)
        assert "f32, activations f32" not in block.layer.describe(), (model_dir, block.layer.describe())
        with torch.no_grad():
            want_inf = block(x)
        want = block(x).detach()
        for clone in (copy.deepcopy(block), pickle.loads(pickle.dumps(block))):
            assert clone.layer.describe() == block.layer.describe(), (model_dir, clone.layer.describe(), block.layer.describe())
            with torch.no_grad():
                assert torch.equal(clone(x), want_inf), (model_dir, rules, rel(clone(x), want_inf))
            assert torch.equal(clone(x).detach(), want), (model_dir, rules)
            again = copy.deepcopy(clone)  # a copy of a copy too
            assert torch.equal(again(x).detach(), want)
    # the selection bias (DeepSeek-V3's e_score_correction_bias: routing state, not a parameter) goes with the copy too
    block = MoE8Block(hidden=64, ffn=32, num_experts=8, top_k=2, score="sigmoid", use_selection_bias=True, rules=fp8)
    block.layer.weight("bias")[:] = np.linspace(-2, 2, 8, dtype=np.float32)
    with torch.no_grad():
        want = block(x)
        for clone in (copy.deepcopy(block), pickle.loads(pickle.dumps(block))):
            assert torch.equal(clone(x), want)
