"""PyTorch's f32 products x[m, 4096] @ W[4096, n] with TF32 off (cuBLAS), the peer of
`thin_gemm` (crates/compute-ptx/examples/thin_gemm.rs): device time per call from CUDA
events around 20 calls, for m = 1..128 and n = 4096, 14336."""
import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
print("torch", torch.__version__, torch.cuda.get_device_name())
for n in (4096, 14336):
    W = torch.randn(4096, n, device="cuda")
    for m in (1, 8, 16, 32, 64, 128):
        x = torch.randn(m, 4096, device="cuda")
        for _ in range(3):
            y = x @ W
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(20):
            y = x @ W
        e.record()
        torch.cuda.synchronize()
        print(f"torch f32 (no tf32) m {m} k 4096 n {n}: {s.elapsed_time(e) / 20 * 1e3:.1f} us")
