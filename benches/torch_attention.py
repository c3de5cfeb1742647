"""PyTorch's SDPA figures for the attention rows of `cuda_bench --attention`.

Same shapes as benches/src/cuda_attention.rs, each under every SDPA backend
that takes it (cuDNN, flash = FlashAttention-2, efficient, math for f32).
Median of CUDA-event timings over repeated calls; prints one JSON line per
(shape, backend): shape (as the Rust rows print it), backend, median_s,
tflops (4*d FLOPs per visible query-key pair). Decode rows are not causal
here: PyTorch's is_causal aligns the mask to the start, so one query would
see one key; our end-aligned mask lets it see all of them, which is what
no mask gives PyTorch. `--quick`: the first two shapes at s = 1024;
`--only TEXT`: the shapes whose name contains TEXT (as `COMPUTE_ATTENTION_ONLY`
does for ours).
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch_timing import median_time


def shapes(quick):
    bf = torch.bfloat16
    if quick:
        return [("full", 4, 32, 32, 1024, 1024, 128, False, bf), ("causal", 4, 32, 32, 1024, 1024, 128, True, bf)]
    return [
        ("full", 4, 32, 32, 4096, 4096, 128, False, bf),
        ("causal", 4, 32, 32, 4096, 4096, 128, True, bf),
        ("gqa32:8 causal", 4, 32, 8, 4096, 4096, 128, True, bf),
        ("full", 1, 32, 32, 16384, 16384, 128, False, bf),
        ("causal", 1, 32, 32, 16384, 16384, 128, True, bf),
        ("full", 16, 16, 16, 1024, 1024, 64, False, bf),
        ("causal", 16, 16, 16, 1024, 1024, 64, True, bf),
        ("decode gqa32:8", 16, 32, 8, 1, 8192, 128, True, bf),
        ("decode gqa32:8", 1, 32, 8, 1, 8192, 128, True, bf),
        ("f32 causal", 4, 32, 32, 2048, 2048, 128, True, torch.float32),
    ]


def pairs(sq, sk, causal):
    if not causal:
        return sq * sk
    # End-aligned: query i sees min(sk, max(0, i + sk - sq + 1)) keys.
    return sum(min(sk, max(0, i + sk - sq + 1)) for i in range(sq))


def main():
    quick = "--quick" in sys.argv
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    for name, b, hq, hkv, sq, sk, d, causal, dtype in shapes(quick):
        if only not in name:
            continue
        shape = f"{name} b{b} h{hq}:{hkv} sq{sq} sk{sk} d{d}"
        q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
        k = torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype)
        v = torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype)
        torch_causal = causal and sq > 1
        flops = 4 * b * hq * d * pairs(sq, sk, causal)
        for bname, backend in backends:
            try:
                with sdpa_kernel(backend):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=torch_causal, enable_gqa=hq != hkv)
                    t = median_time(fn, reps=15, inner=3)
            except RuntimeError as e:
                print(json.dumps({"shape": shape, "backend": bname, "skipped": str(e).splitlines()[0][:120]}), flush=True)
                continue
            print(json.dumps({"shape": shape, "backend": bname, "median_s": t, "tflops": flops / t / 1e12,
                              "kv_gbps": 2 * k.numel() * k.element_size() / t / 1e9}), flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
