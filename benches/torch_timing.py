"""The timing the PyTorch peer scripts share (`torch_half.py`, `torch_attention.py`)."""
import torch


def median_time(fn, reps=20, inner=4):
    """Median seconds per call of `fn`: one warm-up call, then `reps` CUDA-event
    timings of `inner` calls each."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / inner)
    times.sort()
    return times[len(times) // 2]
