"""The peer of `cargo run --release -p dispatch --features cuda --example llama`:
the same Llama architecture in plain PyTorch, eager (torch only: embedding,
RMSNorm, separate q/k/v projections, half-split rotary embedding, grouped-query
attention through `scaled_dot_product_attention` (cuDNN's backend off: it
plans anew for every key length) against a preallocated KV cache, SwiGLU feed-forward, final norm, LM head, greedy argmax), with random
weights of the same shapes. Prints prefill and decode tokens/s, the device's
copy bandwidth and the decode roofline measured in the same process, as one
JSON line. With `--transformers`, also times Hugging Face transformers'
`LlamaForCausalLM` (eager attention, its default dynamic cache) of the same
configuration with `generate(do_sample=False)`.

    python3 benches/torch_llama.py [--config 1b|tiny] [--dtype bf16] [--prompt 512] [--new 256] [--transformers]

Random weights give the same timings as trained ones; they are not the
example's weights (tokens differ), so compare speeds, not tokens.
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

CONFIGS = {
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=97, theta=10000.0),
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=32000, theta=10000.0),
}


class Llama:
    def __init__(self, c, dtype, max_seq, device="cuda"):
        self.c, self.dtype = c, dtype
        h, d = c["hidden"], c["hidden"] // c["heads"]
        self.d = d

        def lin(out, inp):
            r = 1.0 / math.sqrt(inp)
            return (torch.rand(out, inp, device=device) * 2 * r - r).to(dtype)

        def norm(n):
            return (0.8 + 0.4 * torch.rand(n, device=device)).to(dtype)

        self.embed = (torch.rand(c["vocab"], h, device=device) * 2 - 1).to(dtype)
        self.layers = []
        for _ in range(c["layers"]):
            self.layers.append(dict(
                attn_norm=norm(h), wq=lin(c["heads"] * d, h), wk=lin(c["kv_heads"] * d, h),
                wv=lin(c["kv_heads"] * d, h), wo=lin(h, c["heads"] * d), ffn_norm=norm(h),
                gate=lin(c["intermediate"], h), up=lin(c["intermediate"], h), down=lin(h, c["intermediate"]),
                k=torch.zeros(1, c["kv_heads"], max_seq, d, device=device, dtype=dtype),
                v=torch.zeros(1, c["kv_heads"], max_seq, d, device=device, dtype=dtype)))
        self.final_norm = norm(h)
        self.lm_head = lin(c["vocab"], h)
        inv = 1.0 / (c["theta"] ** (torch.arange(0, d, 2, device=device).float() / d))
        t = torch.arange(max_seq, device=device).float()
        freqs = torch.outer(t, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(dtype), emb.sin().to(dtype)
        self.pos = 0

    def weight_bytes(self):
        n = self.lm_head.numel() + self.final_norm.numel()
        for l in self.layers:
            n += sum(l[k].numel() for k in ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "gate", "up", "down"))
        return n * self.lm_head.element_size()

    @staticmethod
    def rms(x, w):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w

    def rope(self, x, pos):
        # x: [1, heads, seq, d]; half-split pairs (Hugging Face's rotate_half).
        seq = x.shape[2]
        cos, sin = self.cos[pos:pos + seq], self.sin[pos:pos + seq]
        x1, x2 = x[..., : self.d // 2], x[..., self.d // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    @torch.no_grad()
    def step(self, ids):
        c, pos, seq = self.c, self.pos, ids.shape[0]
        x = self.embed[ids]
        for l in self.layers:
            h = self.rms(x, l["attn_norm"])
            q = (h @ l["wq"].T).view(seq, c["heads"], self.d).transpose(0, 1).unsqueeze(0)
            k = (h @ l["wk"].T).view(seq, c["kv_heads"], self.d).transpose(0, 1).unsqueeze(0)
            v = (h @ l["wv"].T).view(seq, c["kv_heads"], self.d).transpose(0, 1).unsqueeze(0)
            q, k = self.rope(q, pos), self.rope(k, pos)
            l["k"][:, :, pos:pos + seq] = k
            l["v"][:, :, pos:pos + seq] = v
            kk, vv = l["k"][:, :, : pos + seq], l["v"][:, :, : pos + seq]
            if seq > 1:
                mask = torch.ones(seq, pos + seq, dtype=torch.bool, device=x.device).tril(pos)
                o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, enable_gqa=True)
            else:
                o = F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)
            x = x + o.squeeze(0).transpose(0, 1).reshape(seq, -1) @ l["wo"].T
            h = self.rms(x, l["ffn_norm"])
            x = x + (F.silu(h @ l["gate"].T) * (h @ l["up"].T)) @ l["down"].T
        logits = self.rms(x[-1:], self.final_norm) @ self.lm_head.T
        self.pos += seq
        return logits.argmax(-1)


def copy_bandwidth():
    a = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    return 10 * 2 * a.numel() * 4 / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="1b", choices=sorted(CONFIGS))
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--transformers", action="store_true")
    a = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    # cuDNN's attention builds a plan for every new key length, which a
    # decoding step changes each time: tens of milliseconds per token. The
    # flash and memory-efficient kernels have no such cost.
    torch.backends.cuda.enable_cudnn_sdp(False)
    c = CONFIGS[a.config]
    torch.manual_seed(0)
    max_seq = a.prompt + a.new
    m = Llama(c, dtype, max_seq)
    prompt = torch.tensor([(i * 7919 + 13) % c["vocab"] for i in range(a.prompt)], device="cuda")
    # Warm-up sequence, then the timed one.
    tok = m.step(prompt)
    m.step(tok)
    m.pos = 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tok = m.step(prompt)
    tok.item()
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(a.new - 1):
        tok = m.step(tok)
        tok.item()  # greedy decoding needs the token on the host, as ours does
    decode = time.perf_counter() - t0
    bw = copy_bandwidth()
    kv = 2 * c["layers"] * c["kv_heads"] * (a.prompt + a.new // 2) * m.d * m.lm_head.element_size()
    per_token = m.weight_bytes() + kv
    out = dict(peer="torch eager", config=a.config, dtype=a.dtype, prompt=a.prompt, new=a.new,
               prefill_tokens_per_s=a.prompt / prefill, decode_tokens_per_s=(a.new - 1) / decode,
               copy_gb_s=bw / 1e9, mb_per_token=per_token / 1e6, roofline_tokens_per_s=bw / per_token,
               device=torch.cuda.get_device_name())
    print(json.dumps(out))
    if a.transformers:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(hidden_size=c["hidden"], num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                          num_key_value_heads=c["kv_heads"], intermediate_size=c["intermediate"],
                          vocab_size=c["vocab"], rope_theta=c["theta"], max_position_embeddings=max_seq,
                          attn_implementation="eager")
        del m
        model = LlamaForCausalLM(cfg).to("cuda", dtype).eval()
        ids = prompt.unsqueeze(0)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(ids)
            torch.cuda.synchronize()
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False)
            torch.cuda.synchronize()
            total = time.perf_counter() - t0
        decode = max(total - prefill, 1e-9)
        print(json.dumps(dict(peer="transformers eager generate", config=a.config, dtype=a.dtype,
                              prompt=a.prompt, new=a.new, prefill_tokens_per_s=a.prompt / prefill,
                              decode_tokens_per_s=(a.new - 1) / decode)))


if __name__ == "__main__":
    main()
