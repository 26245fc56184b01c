"""KTransformers' CPU MoE kernels (kt-kernel, AMX), a peer of 'moe8 bench layer'.

Times one whole MoE layer: router linear (torch), softmax, top-k,
renormalize, then kt-kernel's fused AMX MoE forward on those experts
(SwiGLU experts: gate [F, D], up [F, D], down [D, F], Qwen2-MoE / Mixtral
style).  The experts live in kt-kernel's own packed form, built in memory
from bf16 weights with the same seed and draw order as torch_moe.py:

  bf16  kt_kernel_ext.moe.AMXBF16_MOE  (bf16 weights, AMX-BF16 tiles)
  int8  kt_kernel_ext.moe.AMXInt8_MOE  (kt-kernel quantizes the bf16 weights
        itself when loading: int8 per output row with an f32 scale;
        activations are quantized per token at run time, AMX-INT8 tiles)

kt-kernel runs on its own thread pool (CPUInfer, one subpool of THREADS
threads pinned to cores 0..THREADS-1, as KTMoEWrapper(cpuinfer_threads=
THREADS, threadpool_count=1)); torch (the router) also gets THREADS threads.
Note: besides those THREADS compute threads, kt-kernel's CPUInfer task thread
busy-waits for the whole forward (NumaJobDistributor::do_numa_job), and idle
pool threads spin for 50 ms before sleeping, so a run keeps THREADS + 1 cores
busy; with THREADS = all cores the threads preempt each other and times come
in multiples of the scheduler tick.  One warm-up run, then REPS timed runs.
Prints one JSON line: {"min_ms": ..., "median_ms": ...}.
Exits 2 with a one-line reason on stderr when kt_kernel cannot be imported
or this CPU has no AMX (amx_bf16 / amx_int8).

usage: python3 kt_moe.py T E K D F bf16|int8 THREADS REPS
"""
import json
import os
import sys

from peer_timing import time_ms


def skip(why):
    print("kt_moe.py: " + why, file=sys.stderr)
    sys.exit(2)


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def layer(T, E, D, F):
    """x [T, D], router [E, D], experts stacked [E, F, D], [E, F, D], [E, D, F]; all bf16.

    Same seed and draw order as torch_moe.py, so both peers see the same layer."""
    import torch
    bf = torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(T, D, dtype=bf)
    wr = (torch.randn(E, D) * D ** -0.5).to(bf)
    wg, wu, wd = torch.empty(E, F, D, dtype=bf), torch.empty(E, F, D, dtype=bf), torch.empty(E, D, F, dtype=bf)
    for w, (n, k) in ((wg, (F, D)), (wu, (F, D)), (wd, (D, F))):
        for e in range(E):
            w[e] = torch.randn(n, k) * k ** -0.5
    return x, wr, wg, wu, wd


def route(x, wr, K):
    """Router linear, softmax, top-k, renormalize: int64 ids [T, K], f32 weights [T, K]."""
    import torch
    probs = torch.softmax(torch.nn.functional.linear(x, wr).float(), dim=-1)
    w, ids = torch.topk(probs, K, dim=-1)
    return ids.contiguous(), (w / w.sum(dim=-1, keepdim=True)).contiguous()


class KTMoE:
    """One kt-kernel AMX MoE layer, built from in-memory bf16 experts."""

    def __init__(self, kind, wg, wu, wd, K, max_len, threads):
        import torch
        from kt_kernel import kt_kernel_ext as ext
        cls = getattr(ext.moe, {"bf16": "AMXBF16_MOE", "int8": "AMXInt8_MOE"}[kind], None)
        if cls is None:
            skip("this kt-kernel build has no %s MoE" % kind)
        E, F, D = wg.shape
        pool = ext.WorkerPoolConfig()
        pool.subpool_count = 1
        pool.subpool_numa_map = [0]
        pool.subpool_thread_count = [threads]
        self.cpu = ext.CPUInfer(pool)
        cfg = ext.moe.MOEConfig(E, K, D, F, 0)  # 0: no gpu_experts_mask, every expert on CPU
        cfg.layer_idx = 0
        cfg.pool = self.cpu.backend_
        # sizes its activation buffers (a forward takes at most max_len tokens); the int8
        # kernel wants a multiple of its 32-row M_STEP
        cfg.max_len = -(-max_len // 32) * 32
        cfg.gate_proj, cfg.up_proj, cfg.down_proj = wg.data_ptr(), wu.data_ptr(), wd.data_ptr()
        cfg.load = cfg.save = False  # pack / quantize from the bf16 pointers, no weight files
        self.moe = cls(cfg)
        p2l = torch.arange(E, dtype=torch.int64)  # physical -> logical expert ids: identity
        self.cpu.submit(self.moe.load_weights_task(p2l.data_ptr()))
        self.cpu.sync()  # now holds its own packed copy; wg, wu, wd may be freed
        self.K = K

    def __call__(self, x, ids, w, out):
        import torch
        n = torch.tensor([x.shape[0]], dtype=torch.int32)
        self.cpu.submit(self.moe.forward_task(n.data_ptr(), self.K, ids.data_ptr(), w.data_ptr(),
                                              x.data_ptr(), out.data_ptr(), False))
        self.cpu.sync()
        return out


def setup(kind):
    """Import torch and kt_kernel (exit 2 when unusable); kt-kernel's C++ chatter goes to stderr."""
    out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        import torch  # noqa: F401
        import kt_kernel
    except Exception as e:  # ImportError, or a missing shared library
        skip("kt_kernel unavailable: %s: %s" % (type(e).__name__, e))
    need = {"bf16": "amx_bf16", "int8": "amx_int8"}[kind]
    if need not in cpu_flags() or getattr(kt_kernel, "__cpu_variant__", "") != "amx":
        skip("no AMX on this CPU (%s absent or kt-kernel variant %s)"
             % (need, getattr(kt_kernel, "__cpu_variant__", "?")))
    return out, kt_kernel.__version__


def main():
    args = sys.argv[1:]
    if len(args) != 8 or args[5] not in ("bf16", "int8"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(1)
    T, E, K, D, F = (int(v) for v in args[0:5])
    kind, threads, reps = args[5], int(args[6]), int(args[7])
    out_fd, version = setup(kind)
    import torch
    torch.set_num_threads(threads)
    with torch.inference_mode():
        x, wr, wg, wu, wd = layer(T, E, D, F)
        moe = KTMoE(kind, wg, wu, wd, K, T, threads)
        del wg, wu, wd
        y = torch.empty(T, D, dtype=torch.bfloat16)

        def forward(h):
            ids, w = route(h, wr, K)
            return moe(h, ids, w, y)

        min_ms, median_ms = time_ms(forward, x, reps)
    line = json.dumps({"min_ms": min_ms, "median_ms": median_ms,
                       "threads": threads, "kt_kernel": version, "torch": torch.__version__})
    os.write(out_fd, (line + "\n").encode())


if __name__ == "__main__":
    main()
