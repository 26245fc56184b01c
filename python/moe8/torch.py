"""PyTorch integration: MoE8Block, an nn.Module whose forward and backward
run moe8 (through a torch.autograd.Function), on CPU float32 tensors.

Its parameters are the moe8 layer's own f32 masters (torch tensors sharing
their memory: an optimizer step updates the layer in place, no copies):
router [D, E], gate and up [E, D, F], down [E, F, D] (x @ W layout), and
with a shared expert shared_gate/shared_up [D, Fs], shared_down [Fs, D],
shared_gate_w [D].  With a quantization rule set the forward quantizes as
the rule says and the backward is straight-through (docs/layer.md).
The aux loss of the last forward is in `block.aux_loss` (a tensor that
carries gradient when aux_loss_weight > 0, added by the caller)."""
import numpy as np
import torch

from . import Layer

_NAMES = ("router", "gate", "up", "down", "shared_gate", "shared_up", "shared_down", "shared_gate_w")


class _MoE8Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, block, *params):
        layer = block.layer
        xn = x.detach().contiguous().numpy()
        ws = layer.new_workspace(xn.shape[0])
        y, aux = layer.forward(xn, workspace=ws)
        ctx.block, ctx.xn, ctx.ws = block, xn, ws
        ctx.names = block.param_names
        return torch.from_numpy(y), torch.tensor(aux, dtype=torch.float32)

    @staticmethod
    def backward(ctx, dy, daux):
        layer = ctx.block.layer
        if ctx.block.aux_loss_weight != 0 and float(daux) != 1.0:
            raise RuntimeError("moe8: the aux loss must enter the loss with weight 1 (set aux_loss_weight instead)")
        g = layer.backward(ctx.xn, dy.detach().contiguous().numpy(), workspace=ctx.ws)
        grads = [torch.from_numpy(g[n]) for n in ctx.names]
        return (torch.from_numpy(g["dx"]), None, *grads)


class MoE8Block(torch.nn.Module):
    """A Mixture-of-Experts block computed by moe8: x [..., D] -> [..., D].

    MoE8Block(hidden, ffn, num_experts, top_k, score="softmax",
              norm_topk_prob=True, shared_ffn=0, shared_gate=False,
              rules=None, seed=0, aux_loss_weight=0.0, ...)"""

    def __init__(self, hidden, ffn, num_experts, top_k, rules=None, seed=0, module_path="model.layers.0.mlp.experts", **config):
        super().__init__()
        config.setdefault("norm_topk_prob", True)
        self.layer = Layer(num_experts=num_experts, top_k=top_k, hidden=hidden, ffn=ffn, rules=rules, module_path=module_path, **config)
        self.layer.init_random(seed)
        self.aux_loss_weight = config.get("aux_loss_weight", 0.0)
        self.param_names = [n for n in _NAMES if not n.startswith("shared") or self.layer.shared_ffn > 0]
        if not self.layer.shared_gate and "shared_gate_w" in self.param_names:
            self.param_names.remove("shared_gate_w")
        self._addr = {}
        for n in self.param_names:
            # the layer's memory itself: the optimizer updates moe8's masters
            # (the tensor keeps the layer alive through the view's buffer)
            view = self.layer.weight(n)
            self._addr[n] = (view.ctypes.data, view.shape)
            self.register_parameter(n, torch.nn.Parameter(torch.from_numpy(view)))
        self.aux_loss = None

    def _check_params(self):
        """The autograd function computes with the layer's memory: a
        parameter that is no longer that memory would silently stop
        training, so it is refused."""
        for n in self.param_names:
            p = getattr(self, n)
            addr, shape = self._addr[n]
            if (not isinstance(p, torch.Tensor) or p.device.type != "cpu" or p.dtype != torch.float32 or not p.is_contiguous()
                    or p.data_ptr() != addr or tuple(p.shape) != tuple(shape)):
                raise RuntimeError("moe8: parameter %s is no longer the moe8 layer's memory (it was replaced, converted or moved: "
                                   "p.data = ..., .double(), .half(), .to(), share_memory()); MoE8Block's parameters must stay "
                                   "float32 CPU tensors over the layer's weights. Write new values in place (p.data.copy_(...))" % n)

    def forward(self, x):
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise TypeError("moe8: MoE8Block takes float32 CPU tensors, got %s on %s" % (x.dtype, x.device))
        if x.dim() < 1 or x.shape[-1] != self.layer.hidden:
            raise ValueError("moe8: MoE8Block input has shape %s; its last dimension must be hidden = %d"
                             % (list(x.shape), self.layer.hidden))
        self._check_params()
        shape = x.shape
        y, aux = _MoE8Function.apply(x.reshape(-1, shape[-1]), self, *[getattr(self, n) for n in self.param_names])
        self.aux_loss = aux
        return y.reshape(shape)
