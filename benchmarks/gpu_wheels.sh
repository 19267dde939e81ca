#!/usr/bin/env bash
# The wheels a GPU machine without network lacks to run benchmarks/gpu_check.py and the tests (docs/benchmarks.md,
# "GPU check"): the project's runtime dependencies that are not already there. Such a machine has Python 3.12
# with torch, transformers, accelerate, peft, tensorboard, numpy, pyarrow, safetensors, sympy, pytest, hypothesis
# and their own dependencies (tqdm, pyyaml, typing-extensions, ...). Left out: matplotlib and its dependencies
# (~20 MB; the eval/ figures only, never imported by the training scripts, the envs or the check).
#
#   bash benchmarks/gpu_wheels.sh [DEST]        # default DEST: gpu_wheels/ (git-ignored); cp312 manylinux x86-64
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-gpu_wheels}
WHEELS=(
    gymnasium==1.4.0 cloudpickle==3.1.3 farama-notifications==0.0.6             # arena_envs, wrappers
    tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1                      # the scripts' flags
    math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2  # TIR-Math's grader
    rank-bm25==0.2.2 rapidfuzz==3.14.6                                          # WebShop's search and reward
)
mkdir -p "$DEST"
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$DEST" --implementation cp \
    --python-version 3.12 --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any "${WHEELS[@]}"
ls -1 "$DEST"/*.whl | wc -l | xargs printf "%s wheels in $DEST, "
du -sh "$DEST" | cut -f1
