"""Checks `dispatch::llama` against transformers on the same checkpoint.

Builds a small random LlamaForCausalLM with transformers, saves it with
`save_pretrained` (config.json + model.safetensors), runs the `llama` example
of `dispatch` on that directory (`--hf`), and compares the prompt's last-position
logits and the greedy tokens with transformers' own forward pass and greedy
generation (float32, eager attention).

    python3 benches/hf_llama_check.py --bin path/to/llama [--engine cuda] [--device cuda]

Prints the largest |logit difference| over the largest |logit| and whether
the greedy tokens agree; exits non-zero when they do not.
"""
import argparse
import subprocess
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True, help="the `llama` example binary")
p.add_argument("--engine", default="cuda")
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--prompt", type=int, default=16)
p.add_argument("--new", type=int, default=16)
args = p.parse_args()

torch.manual_seed(0)
cfg = LlamaConfig(
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=3,
    num_attention_heads=8,
    num_key_value_heads=2,
    vocab_size=1000,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    initializer_range=0.2,  # logits far apart enough for greedy choices to be stable
    attn_implementation="eager",
)
model = LlamaForCausalLM(cfg).float().eval()
with torch.no_grad():
    for n, w in model.named_parameters():
        if "norm" in n:
            w.uniform_(0.8, 1.2)

with tempfile.TemporaryDirectory() as d:
    model.save_pretrained(d, safe_serialization=True)
    out = f"{d}/ours.txt"
    cmd = [args.bin, "--hf", d, "--dtype", "f32", "--engine", args.engine,
           "--prompt", str(args.prompt), "--new", str(args.new), "--logits", out]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    lines = open(out).read().splitlines()
ours = torch.tensor([float(x) for x in lines[:-1]], dtype=torch.float64)
our_tokens = eval(lines[-1].split(":", 1)[1])

prompt = [(i * 7919 + 13) % cfg.vocab_size for i in range(args.prompt)]
model = model.to(args.device)
with torch.no_grad():
    ids = torch.tensor([prompt], device=args.device)
    theirs = model(ids).logits[0, -1].double().cpu()
    gen = model.generate(ids, max_new_tokens=args.new, do_sample=False, min_new_tokens=args.new,
                         eos_token_id=None, pad_token_id=0)
their_tokens = gen[0, len(prompt):].tolist()

err = (ours - theirs).abs().max().item() / theirs.abs().max().item()
same = our_tokens == their_tokens
print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, device {args.device}")
print(f"last-position logits: max |ours - transformers| / max |transformers| = {err:.3e}")
print(f"greedy tokens, ours:         {our_tokens}")
print(f"greedy tokens, transformers: {their_tokens}")
print(f"greedy tokens equal: {same}")
sys.exit(0 if same and err < 1e-4 else 1)
