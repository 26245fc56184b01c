"""The timing the layer peers share (torch_moe.py, kt_moe.py)."""
import time


def time_ms(forward, x, reps, warm=1):
    """Min and median ms of reps runs of forward(x), after warm untimed runs."""
    for _ in range(warm):
        forward(x)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        forward(x)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[0] * 1e3, times[len(times) // 2] * 1e3
