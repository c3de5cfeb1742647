"""PyTorch's figures for the f16/bf16 rows of `compute-bench --backend cuda`.

Same ops and sizes as benches/src/cuda_half.rs: element-wise ops, rms_norm and
softmax on 256M values, casts f32<->bf16, and a device copy of the same bytes.
Median of CUDA-event timings over repeated launches; prints one JSON object per
row (op, shape, dtype, median_s, gbps). Run on the GPU machine by
`.gpu/run.sh bench`; `--quick` uses 64M values as the quick bench does.
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch_timing import median_time


def row(op, shape, dtype, seconds, nbytes):
    print(json.dumps({"op": op, "shape": shape, "dtype": dtype, "median_s": seconds,
                      "gbps": nbytes / seconds / 1e9}), flush=True)


def main():
    n = (64 if "--quick" in sys.argv else 256) << 20
    cols = 4096
    rows = n // cols
    dev = "cuda"
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    for dtype in (torch.bfloat16, torch.float16):
        name = str(dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float16", "f16")
        h = 2
        x = torch.rand(n, device=dev, dtype=torch.float32).mul_(2).sub_(1).to(dtype)
        y = torch.rand(n, device=dev, dtype=torch.float32).mul_(2).sub_(1).to(dtype)
        z = torch.empty_like(x)
        row("copy", f"{n >> 20}M", name, median_time(lambda: z.copy_(x)), 2 * h * n)
        row("relu", f"{n >> 20}M", name, median_time(lambda: F.relu(x)), 2 * h * n)
        row("gelu_tanh", f"{n >> 20}M", name, median_time(lambda: F.gelu(x, approximate="tanh")), 2 * h * n)
        row("add", f"{n >> 20}M", name, median_time(lambda: torch.add(x, y, out=z)), 3 * h * n)
        x2 = x.view(rows, cols)
        gamma = torch.rand(cols, device=dev, dtype=dtype)
        row("rms_norm", f"{rows}x{cols}", name, median_time(lambda: F.rms_norm(x2, (cols,), gamma, 1e-5)), 2 * h * n)
        row("softmax", f"{rows}x{cols}", name, median_time(lambda: torch.softmax(x2, dim=-1)), 2 * h * n)
        del x, y, z, x2
    x32 = torch.rand(n, device=dev, dtype=torch.float32)
    xb = x32.to(torch.bfloat16)
    row("cast f32>bf16", f"{n >> 20}M", "bf16", median_time(lambda: x32.to(torch.bfloat16)), 6 * n)
    row("cast bf16>f32", f"{n >> 20}M", "bf16", median_time(lambda: xb.to(torch.float32)), 6 * n)


if __name__ == "__main__":
    main()
