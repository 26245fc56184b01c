"""PyTorch integration: MoE8Block, an nn.Module whose forward and backward
run moe8 (through a torch.autograd.Function), on CPU tensors.

Its parameters are the moe8 layer's own f32 masters (torch tensors sharing
their memory: an optimizer step updates the layer in place, no copies):
router [D, E], gate and up [E, D, F], down [E, F, D] (x @ W layout), and
with a shared expert shared_gate/shared_up [D, Fs], shared_down [Fs, D],
shared_gate_w [D].  A parameter that stops being that memory (.double(),
.half(), share_memory(), p.data = ...) is refused at the next call.  With a
quantization rule set the forward quantizes as the rule says and the
backward is straight-through (docs/layer.md).

- Inference: with grad off (torch.no_grad(), inference_mode) the block runs
  the prepared, fused path (weights quantized and packed once, again after
  any in-place change of a parameter).
- dtypes: float32 and bfloat16 inputs (bf16 is computed in f32 and returned
  as bf16).
- MoE8Block.from_pretrained(model_dir, layer=None, rules=None) takes its
  weights from a checkpoint; copy.deepcopy, pickle and torch.save(module)
  work (the state is the config, the rule the layer runs under, the
  format of expert codes loaded from an FP8 / int8 file, and the weights,
  the selection bias included): a copy computes the original's bytes.
Loading a transformers model with moe8's experts and no float copy of
them: register_transformers(), then from_pretrained(...,
quantization_config=moe8.torch.Moe8Config(rules)) (docs/integration.md).
The aux loss of the last forward is in `block.aux_loss` (a tensor that
carries gradient when aux_loss_weight > 0, added by the caller)."""
try:
    import torch as _torch  # noqa: F401
except ImportError as _e:  # moe8 works without PyTorch; this module then says what it needs
    _why = str(_e)

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise ImportError("moe8.torch.%s needs PyTorch (pip install torch, or apt-get install python3-torch): %s" % (name, _why))

    __all__ = []
else:
    from ._torch import MoE8Block, from_hf, patch, _HFBlock, _MoE8Function  # noqa: F401
    from ._torch_op import (experts, fused_experts, KExperts, register_layer, unregister_layer, register_transformers,  # noqa: F401
                            set_experts_rules, transformers_experts_forward)

    def __getattr__(name):
        # transformers' quantizer plug-in: importing it imports transformers
        if name in ("Moe8Config", "Moe8HfQuantizer", "from_pretrained"):
            from . import _hf_quant
            _hf_quant.register()
            return getattr(_hf_quant, name)
        raise AttributeError("module 'moe8.torch' has no attribute %r" % name)

    __all__ = ["MoE8Block", "from_hf", "patch", "experts", "fused_experts", "KExperts", "register_layer", "unregister_layer",
               "register_transformers", "set_experts_rules"]
