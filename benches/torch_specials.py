# PyTorch's results on NaN, ±inf, ±0 and subnormal inputs, on the CPU and on
# CUDA: the semantics the conformance suite's float64 reference follows
# (docs/architecture.md, "Special values"). Run: python3 benches/torch_specials.py
import torch
import torch.nn.functional as F

inf, nan = float("inf"), float("nan")
x = torch.tensor([nan, inf, -inf, 0.0, -0.0, 1e-45, 1.0])
print("torch", torch.__version__, "x =", x.tolist())
for dev in ["cpu", "cuda"]:
    v = x.to(dev)
    ops = {
        "relu": torch.relu(v), "leaky_relu": F.leaky_relu(v, 0.01), "elu": F.elu(v, 1.3),
        "sigmoid": torch.sigmoid(v), "tanh": torch.tanh(v), "silu": F.silu(v),
        "gelu_tanh": F.gelu(v, approximate="tanh"), "gelu_erf": F.gelu(v), "clamp": v.clamp(-0.75, 2.5),
        "mul_-1.7": v * -1.7,
    }
    for k, t in ops.items():
        print(dev, k, t.tolist())
    for name, row in [("nan", [1.0, nan, 2.0]), ("+inf", [1.0, inf, 2.0]), ("two +inf", [1.0, inf, inf]),
                      ("-inf", [1.0, -inf, 2.0]), ("all -inf", [-inf, -inf, -inf]), ("+inf,-inf", [inf, -inf, 1.0])]:
        r = torch.tensor([row], device=dev)
        g = torch.ones(3, device=dev)
        print(dev, "row", name, "max", r.max().item(), "sum", r.sum().item(),
              "softmax", F.softmax(r, -1).tolist(), "log_softmax", F.log_softmax(r, -1).tolist(),
              "layer_norm", F.layer_norm(r, (3,)).tolist(), "rms_norm", F.rms_norm(r, (3,), g, 1e-6).tolist())
    a = torch.tensor([[1.0, nan], [2.0, 3.0], [inf, 1.0], [inf, -inf]], device=dev)
    b = torch.tensor([[1.0, 0.0], [3.0, 4.0]], device=dev)
    print(dev, "matmul", (a @ b).tolist())
