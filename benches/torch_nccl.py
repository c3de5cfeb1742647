"""PyTorch's NCCL all-reduce (torch.distributed, one process per visible GPU),
timed as `cargo run -p compute-ptx --features nccl --example nccl_bench` times
ours: per size and dtype, the median over `--reps` iterations of one in-place
sum all-reduce and a wait (after three warm-up calls; a barrier before each
timed iteration so every rank starts together). Prints one JSON line per row
from rank 0, with the algorithm and bus bandwidth (`algbw * 2(n - 1)/n`).

    python3 benches/torch_nccl.py [--reps 20] [--mb 1,16,64,256]
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, mbs, reps, port):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        for mb in mbs:
            n = (mb << 20) // torch.tensor([], dtype=dtype).element_size()
            x = torch.ones(n, dtype=dtype, device="cuda")
            for _ in range(3):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            times = []
            for _ in range(reps):
                dist.barrier()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                dist.all_reduce(x)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            times.sort()
            s = times[len(times) // 2]
            algbw = n * x.element_size() / s / 1e9
            if rank == 0:
                row = {
                    "op": "all_reduce",
                    "peer": f"torch {torch.__version__} NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}",
                    "dtype": name,
                    "mb": mb,
                    "ranks": world,
                    "median_s": s,
                    "algbw_gbps": round(algbw, 1),
                    "busbw_gbps": round(algbw * 2 * (world - 1) / world, 1),
                }
                print(json.dumps(row), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--mb", default="1,16,64,256")
    a = p.parse_args()
    world = torch.cuda.device_count()
    mbs = [int(m) for m in a.mb.split(",")]
    mp.spawn(run, args=(world, mbs, max(a.reps, 3), 29511), nprocs=world)


if __name__ == "__main__":
    main()
