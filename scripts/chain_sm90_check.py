"""Compile the cuda device's attention chain kernels for an H100 (sm_90), no GPU needed.

``PYTHONPATH=. python scripts/chain_sm90_check.py`` renders the chain kernels of a few
attention shapes as a GPU would run them (``triton_chain.INTERPRETER = False``: GPU
tiles, bfloat16 straight into the dots; the cases themselves run under the interpreter
to get there), then compiles each with the installed Triton for sm_90 in a fresh
process (the interpreter patches ``triton.language``), pointer arguments taken 16-byte
aligned as Triton's launcher specialises them. Per kernel it prints the shared memory,
whether the key/value loads are pipelined (``cp.async``) and whether the dots are
wgmma; it exits 1 if any kernel fails to compile or needs more shared memory than an
H100 has. What it cannot tell: speed, and
what an older Triton (the GPU machine's) refuses that this one takes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: shared memory one block may take on an H100 (227 KiB): a kernel over it compiles, then
#: fails at launch (OutOfResources)
H100_SHARED = 232448
_TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int64": "i64", "int32": "i32", "bool": "i1"}


def render(out: Path) -> None:
    """Run the cases on the interpreter, writing each chain kernel's source and launch."""
    os.environ["BRAZE_CUDA_INTERPRET"] = "1"
    import math

    import numpy as np

    import braze
    import braze.nn.functional as F
    from braze.codegen import triton_chain
    from braze.runtime import cuda as runtime

    triton_chain.INTERPRETER = False
    arg_types: dict[str, str] = {}
    chain_kernels, compile_kernel = triton_chain.chain_kernels, runtime.compile_kernel

    def capture_types(k: Any, name: str) -> Any:
        arg_types.clear()
        arg_types.update({f"a{i}": "*" + _TYPES[d.name] for i, (d, _) in enumerate(k.args)})
        return chain_kernels(k, name)

    def capture(r: Any) -> Any:
        if r.name.startswith("braze_a"):
            stem = f"{r.name}_{len(list(out.glob('*.py')))}"
            (out / f"{stem}.py").write_text(r.source)
            (out / f"{stem}.json").write_text(json.dumps({"name": r.name, "meta": r.meta, "types": arg_types}))
        return compile_kernel(r)
    triton_chain.chain_kernels = capture_types  # type: ignore[assignment]
    runtime.compile_kernel = capture  # type: ignore[assignment]

    def t(*shape: int, dtype: Any = braze.bfloat16) -> Any:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        return braze.tensor(x, device="cuda").to(dtype=dtype)

    def causal(q: Any, k: Any, v: Any) -> Any:
        n = q.shape[-2]
        i, j = braze.arange(n, device="cuda")[:, None], braze.arange(n, device="cuda")[None, :]
        return braze.softmax((q @ k.mT * q.shape[-1] ** -0.5).masked_fill(j > i, -math.inf), -1) @ v

    for d in (64, 128):
        cases = [(causal, (t(1, 2, 300, d), t(1, 2, 300, d), t(1, 2, 300, d))),
                 (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                  (t(1, 4, 1, d), t(1, 1, 3000, d), t(1, 1, 3000, d))),
                 (lambda q, k, v: braze.softmax(q @ k.mT, -1) @ v,
                  tuple(t(1, 2, 100, d, dtype=braze.float32) for _ in range(3))),
                 # a mask tensor: one more (rows x keys) tile loaded per stage
                 (lambda q, k, v, m: braze.softmax(q @ k.mT * q.shape[-1] ** -0.5 + m, -1) @ v,
                  (t(1, 2, 300, d), t(1, 2, 300, d), t(1, 2, 300, d), t(1, 1, 300, 300)))]
        for fn, args in cases:
            braze.cuda.synchronize()
            fn(*args).numpy()


def compile_all(out: Path) -> int:
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failed = 0
    for js in sorted(out.glob("*.json")):
        info = json.loads(js.read_text())
        spec = importlib.util.spec_from_file_location(js.stem, js.with_suffix(".py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, info["name"])
        names, meta = list(fn.arg_names), info["meta"]
        sig = {n: "constexpr" if n in meta else "*fp32" if n == "part" else info["types"][n] for n in names}
        constexprs = {(names.index(k),): v for k, v in meta.items() if k in names}
        aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*")}
        try:
            k = triton.compile(ASTSource(fn, sig, constexprs, attrs=aligned), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": meta["num_warps"], "num_stages": meta["num_stages"]})
        except Exception as e:  # the compiler's own error, with the kernel's line
            failed += 1
            print(f"FAILED {js.stem} {meta}\n{e}")
            continue
        ptx = k.asm["ptx"]
        fits = k.metadata.shared <= H100_SHARED
        failed += not fits
        print(f"{'ok' if fits else 'TOO MUCH SHARED MEMORY'} {js.stem}: BM={meta['BM']} BN={meta['BN']} BD={meta['BD']} warps={meta['num_warps']} "
              f"stages={meta['num_stages']} shared={k.metadata.shared} cp.async={ptx.count('cp.async.')} "
              f"wgmma={ptx.count('wgmma.mma_async')}")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compile"]:
        sys.exit(compile_all(Path(sys.argv[2])))
    with tempfile.TemporaryDirectory() as tmp:
        render(Path(tmp))
        sys.exit(subprocess.call([sys.executable, __file__, "--compile", tmp]))
