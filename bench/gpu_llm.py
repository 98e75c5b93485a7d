"""SmolLM2 decoding and prefill on braze's cuda device beside torch eager (issue 16, part 5).

    PYTHONPATH=. python3 bench/gpu_llm.py            # on a GPU machine with torch
    PYTHONPATH=.:/tmp/torchsite .venv/bin/python bench/gpu_llm.py --smoke   # here: interpreter + torch CPU

``run(log)`` is what ``bench/gpu.py`` imports; it returns a JSON-able dict whose
"markdown" is the table. The same model file (the default, SmolLM2-135M-Instruct Q4_1)
runs three ways, greedy, on the same prompt:

- **braze cuda**: the model loaded as braze loads it (weights in their GGUF blocks) and
  moved with ``.to("cuda")``: quantized GEMV/GEMM kernels dequantizing in registers,
  each decoding step recorded, the logits copied to the host and the token picked there;
- **braze cuda generate**: the same model through ``generate_ids`` (what ``braze
  generate --device cuda`` runs): the prompt through a captured prefill bucket, the
  decoding step captured and replayed (on a GPU one CUDA graph a step), float16 KV caches;
- **torch eager** float32 and bfloat16: the same architecture written below in torch
  (~60 lines), over the weights braze dequantizes (``load_llm(dequantize=True)``),
  on the GPU; its rotary tables are braze's own, so both compute the same function.

Decode: tokens/s from the median step time of the steps after ``WARMUP`` (>= 10), each
step timed to its logits on the host (braze) or its argmax as a Python int (torch): what
a generation loop waits for. Prefill: a ``PREFILL``-token prompt into empty caches, the
median of ``REPS`` runs after a warm-up, tokens/s. The first ``COMPARE`` generated tokens
of each side are printed and compared with braze's (bfloat16 may differ: it rounds).
``--smoke`` keeps one layer, few tokens, braze under Triton's interpreter and torch on
the CPU: the script's own test, not a measurement.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np

PROMPT = "The capital of France is"
LONG = ("The history of the city begins with a small settlement on an island in the river, where "
        "fishermen and traders built their houses and a market. ")
PREFILL, COMPARE, WARMUP, REPS = 128, 16, 4, 10

Log = Callable[[str], None]


# ---------------------------------------------------------------------------- torch model

class TorchLlama:
    """The Llama forward (as ``braze/models/llama.py`` builds it) in torch eager, over
    braze's dequantized weights: float32 or bfloat16 weights and activations."""

    def __init__(self, torch: Any, model: Any, device: str, dtype: Any, max_len: int) -> None:
        self.t, self.c = torch, model.config
        c = self.c

        def w(t: Any) -> Any:
            return torch.from_numpy(np.array(t.numpy())).to(device=device, dtype=dtype)
        self.embed, self.norm, self.out = w(model.embed.weight), w(model.norm.weight), w(model.output.weight)
        self.layers = [dict(an=w(b.attn_norm.weight), q=w(b.attn.q.weight), k=w(b.attn.k.weight),
                            v=w(b.attn.v.weight), o=w(b.attn.o.weight), mn=w(b.mlp_norm.weight),
                            g=w(b.mlp.gate.weight), u=w(b.mlp.up.weight), d=w(b.mlp.down.weight))
                       for b in model.blocks]
        rot = model.blocks[0].attn.rotary
        rot.reserve(max_len)
        self.cos, self.sin = w(rot.cos), w(rot.sin)
        self.interleaved = rot.interleaved
        shape = (c.n_kv_heads, max_len, c.head_dim)
        self.kc = [torch.zeros(shape, device=device, dtype=dtype) for _ in self.layers]
        self.vc = [torch.zeros(shape, device=device, dtype=dtype) for _ in self.layers]

    def rms(self, x: Any, g: Any) -> Any:
        xf = x.float()
        return (xf * self.t.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.c.norm_eps)).to(x.dtype) * g

    def rope(self, x: Any, pos: int) -> Any:  # x (heads, T, hd)
        t = x.shape[1]
        cos, sin = self.cos[pos:pos + t], self.sin[pos:pos + t]
        if self.interleaved:
            x0, x1 = x[..., 0::2], x[..., 1::2]
            return self.t.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2)
        h = x.shape[-1] // 2
        x0, x1 = x[..., :h], x[..., h:]
        return self.t.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1)

    def __call__(self, ids: list[int], pos: int) -> Any:
        """Logits (vocab,) of the last of ``ids``, which sit at positions pos.. (the caches
        before pos are this sequence's)."""
        t, c, F = len(ids), self.c, self.t.nn.functional
        x = self.embed[self.t.tensor(ids, device=self.embed.device)]
        for i, L in enumerate(self.layers):
            h = self.rms(x, L["an"])
            q = self.rope((h @ L["q"].T).view(t, c.n_heads, c.head_dim).transpose(0, 1), pos)
            k = self.rope((h @ L["k"].T).view(t, c.n_kv_heads, c.head_dim).transpose(0, 1), pos)
            self.kc[i][:, pos:pos + t] = k
            self.vc[i][:, pos:pos + t] = (h @ L["v"].T).view(t, c.n_kv_heads, c.head_dim).transpose(0, 1)
            kk, vv = self.kc[i][:, :pos + t], self.vc[i][:, :pos + t]
            mask = self.t.ones(t, pos + t, dtype=self.t.bool, device=x.device).tril(pos)
            a = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, enable_gqa=True)
            x = x + a.transpose(0, 1).reshape(t, -1) @ L["o"].T
            h = self.rms(x, L["mn"])
            x = x + (F.silu(h @ L["g"].T) * (h @ L["u"].T)) @ L["d"].T
        return self.rms(x[-1:], self.norm)[0] @ self.out.T


# ---------------------------------------------------------------------------- timing

def _median_tps(times: list[float], tokens: int) -> float:
    return tokens / statistics.median(times)


def run_braze(model: Any, prompt: list[int], long: list[int], steps: int, reps: int, log: Log) -> dict[str, Any]:
    import braze
    from braze.stats import COUNTERS
    ctx = max(len(long), len(prompt) + steps) + 1

    def logits(ids: list[list[int]], caches: Any) -> np.ndarray:
        return np.asarray(model(braze.tensor(ids, device="cuda"), caches, last_only=True)[0, -1].numpy())

    caches = model.new_cache(ctx)
    t0 = time.perf_counter()
    first = logits([prompt], caches)
    prompt_s = time.perf_counter() - t0
    tokens, times, launches = [int(np.argmax(first))], [], []
    for _ in range(steps - 1):
        before = COUNTERS["kernel_launches"]
        t0 = time.perf_counter()
        row = logits([[tokens[-1]]], caches)
        times.append(time.perf_counter() - t0)
        launches.append(COUNTERS["kernel_launches"] - before)
        tokens.append(int(np.argmax(row)))
    pre = []
    for _ in range(reps + 1):  # (the first: warm-up, plans and kernels made)
        caches = model.new_cache(ctx)
        t0 = time.perf_counter()
        logits([long], caches)
        pre.append(time.perf_counter() - t0)
    log(f"  braze cuda: first call of the prompt {prompt_s:.2f} s, {launches[-1] if launches else 0} kernel launches per step")
    return {"tokens": tokens, "step_s": times, "prefill_s": pre[1:], "launches_per_step": launches[-1] if launches else 0}


def run_generate(model: Any, prompt: list[int], long: list[int], steps: int, reps: int, log: Log) -> dict[str, Any]:
    """What ``braze generate --device cuda`` runs: the prompt through a captured prefill
    bucket, then the captured decoding step replayed (on a GPU, one CUDA graph launch a
    step). Each step is timed from one token to the next as the generation loop yields
    them (the token chosen on the host from the step's logits)."""
    from braze.generate import GenerationStats, generate_ids
    from braze.stats import COUNTERS
    tokens: list[int] = []
    times: list[float] = []
    launches: list[tuple[int, int]] = []  # per step: (CUDA graphs, kernels one by one)
    before = (0, 0)
    t0 = time.perf_counter()
    stats = GenerationStats()
    for tok in generate_ids(model, prompt, steps, stats=stats):
        t1 = time.perf_counter()
        if tokens:
            times.append(t1 - t0)
            launches.append((COUNTERS["graph_launches"] - before[0], COUNTERS["kernel_launches"] - before[1]))
        tokens.append(tok)
        before = (COUNTERS["graph_launches"], COUNTERS["kernel_launches"])
        t0 = time.perf_counter()
    pre = []
    for _ in range(reps + 1):  # (the first: its bucket captured)
        stats = GenerationStats()
        list(generate_ids(model, long, 1, stats=stats))
        pre.append(stats.prompt_seconds)
    log(f"  braze cuda generate: (graph launches, kernel launches) of the last steps {launches[-3:]}")
    return {"tokens": tokens, "step_s": times, "prefill_s": pre[1:], "launches_per_step": launches[-1] if launches else None}


def run_torch(torch: Any, tm: TorchLlama, prompt: list[int], long: list[int], steps: int, reps: int,
              sync: Callable[[], None]) -> dict[str, Any]:
    with torch.inference_mode():
        tokens = [int(tm(prompt, 0).argmax())]
        times = []
        for i in range(steps - 1):
            t0 = time.perf_counter()
            tokens.append(int(tm([tokens[-1]], len(prompt) + i).argmax()))  # (the int waits for the GPU)
            times.append(time.perf_counter() - t0)
        pre = []
        for _ in range(reps + 1):
            sync()
            t0 = time.perf_counter()
            tm(long, 0)
            sync()
            pre.append(time.perf_counter() - t0)
    return {"tokens": tokens, "step_s": times, "prefill_s": pre[1:]}


def run(log: Log = print, quick: bool = False, smoke: bool = False) -> dict[str, Any]:
    """The three ways side by side; returns {"rows": [...], "markdown": table, ...}."""
    if smoke:
        os.environ.setdefault("BRAZE_CUDA_INTERPRET", "1")
    import torch
    import braze
    from braze.models import load_llm
    from braze.nn import ModuleList
    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    if not smoke and dev != "cuda":
        raise SystemExit("bench/gpu_llm.py: torch sees no GPU (--smoke tests the script on the CPU)")
    steps = 3 if smoke else COMPARE + WARMUP
    reps = 1 if smoke else (REPS if quick else 2 * REPS)
    loaded = load_llm()
    tok = loaded.tokenizer
    prompt = tok.encode(PROMPT)
    long = tok.encode(LONG * 8)[:8 if smoke else PREFILL]
    floats = load_llm(dequantize=True).model
    model = loaded.model
    if smoke:  # one layer: the interpreter runs a kernel's every program in numpy
        for m in (model, floats):
            m.blocks = ModuleList(list(m.blocks)[:1])
            m.config = replace(m.config, n_layers=1)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    out: dict[str, Any] = {"model": loaded.path.name, "prompt": PROMPT, "prefill_tokens": len(long),
                           "torch": torch.__version__, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                           "braze_interpreting": bool(braze.cuda.interpreting()) if braze.cuda.is_available() else None}
    results: dict[str, dict[str, Any]] = {}
    log(f"gpu_llm: {out['model']}, {len(prompt)}-token prompt, {steps} greedy steps, prefill {len(long)} tokens")
    model.to("cuda")
    results["braze cuda (Q4_1 blocks)"] = run_braze(model, prompt, long, steps, reps, log)
    results["braze cuda generate (captured step, f16 KV)"] = run_generate(model, prompt, long, steps, reps, log)
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        tm = TorchLlama(torch, floats, dev, dtype, max(len(long), len(prompt) + steps) + 1)
        results[f"torch eager {name} ({dev})"] = run_torch(torch, tm, prompt, long, steps, reps, sync)
        del tm
    ref = results["braze cuda (Q4_1 blocks)"]["tokens"][:COMPARE]
    rows = []
    for name, r in results.items():
        timed = r["step_s"][WARMUP - 1:] if not smoke else r["step_s"]
        row = {"name": name, "decode_tps": _median_tps(timed, 1), "prefill_tps": _median_tps(r["prefill_s"], len(long)),
               "tokens": r["tokens"][:COMPARE], "same_tokens": r["tokens"][:COMPARE] == ref,
               "text": tok.decode(r["tokens"][:COMPARE])}
        rows.append(row)
        log(f"  {name}: decode {row['decode_tps']:.1f} tok/s, prefill {row['prefill_tps']:.1f} tok/s, "
            f"tokens {'=' if row['same_tokens'] else '!='} braze's: {row['text']!r}")
    base = next(r["decode_tps"] for r in rows if r["name"].startswith("torch eager float32"))
    md = ["| model, greedy | decode tok/s (median step) | prefill tok/s | x torch f32 decode | first tokens same |",
          "|---|---|---|---|---|"]
    md += [f"| {r['name']} | {r['decode_tps']:.1f} | {r['prefill_tps']:.1f} | {r['decode_tps'] / base:.2f} | "
           f"{'yes' if r['same_tokens'] else 'no'} |" for r in rows]
    out.update(rows=rows, launches_per_step={k: r.get("launches_per_step") for k, r in results.items()},
               markdown=f"SmolLM2 on {out['device']} ({out['model']}, prefill {len(long)} tokens):\n\n" + "\n".join(md))
    print("\n".join(md))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="one layer, braze interpreted, torch on the CPU")
    ap.add_argument("--quick", action="store_true", help="fewer prefill runs")
    args = ap.parse_args(argv)
    run(lambda m: print(m, file=sys.stderr, flush=True), quick=args.quick, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
