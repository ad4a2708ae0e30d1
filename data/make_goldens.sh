#!/usr/bin/env bash
# Regenerates the shipped sample and every golden listed in goldens.csv:
#   inputs/models with hk_generate (seeded, so the same bytes on any machine),
#   reference outputs with apps/hk_reference.py (PyTorch, float64, on the CPU).
#
# usage: data/make_goldens.sh [path/to/hk_generate]
#   HK_GENERATE  hk_generate binary (default: the argument, else build/apps/hk_generate)
#   PYTHON       a Python with torch, h5py and numpy (default: python3)
set -euo pipefail

data="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$data")"
gen="${1:-${HK_GENERATE:-$root/build/apps/hk_generate}}"
python="${PYTHON:-python3}"
reference="$root/apps/hk_reference.py"

[[ -x "$gen" ]] || { echo "make_goldens.sh: no hk_generate at $gen (build it, or pass its path)" >&2; exit 1; }
"$python" -c 'import torch, h5py, numpy' 2>/dev/null ||
  { echo "make_goldens.sh: $python lacks torch/h5py/numpy (set PYTHON)" >&2; exit 1; }

mkdir -p "$data/goldens"

# name  hk_generate arguments (every golden is one file holding /model and /input)
make() {
  local file="$1"; shift
  "$gen" --quiet --output "$data/$file" "$@"
  "$python" "$reference" --device cpu --dtype float64 --input "$data/$file" \
            --output "$data/${file%.h5}.ref.h5" > /dev/null
  echo "made $file and ${file%.h5}.ref.h5"
}

# The shipped sample (the README's run command) doubles as the first golden.
make sample.h5                  --batch 4 --seq 16 --d-model 32 --heads 4 --ffn 64 --layers 2 --causal 1 --seed 1
mv "$data/sample.ref.h5" "$data/goldens/sample.ref.h5"

make goldens/causal_pad_hd8_l1.h5   --batch 4 --seq 24 --d-model 64 --heads 8 --ffn 128 --layers 1 --causal 1 \
                                    --lengths-list 0,1,S --seed 11
make goldens/bidir_pad_hd32_l4.h5   --batch 4 --seq 24 --d-model 64 --heads 2 --ffn 96 --layers 4 --causal 0 \
                                    --lengths-list 0,1,S --seed 12
make goldens/nontrivial_ln.h5       --batch 3 --seq 20 --d-model 64 --heads 4 --ffn 128 --layers 2 --causal 1 \
                                    --nontrivial-ln --lengths-list 0,1,S --seed 13
make goldens/fp16_weights_fp16_x.h5 --batch 3 --seq 16 --d-model 32 --heads 1 --ffn 64 --layers 2 --causal 0 \
                                    --weights-dtype float16 --input-dtype float16 --nontrivial-ln --seed 14
make goldens/fp64_no_lengths.h5     --batch 2 --seq 16 --d-model 32 --heads 4 --ffn 32 --layers 1 --causal 0 \
                                    --weights-dtype float64 --no-lengths --eps 1e-6 --seed 15
make goldens/case1_b2.h5            --case 1 --cases "$data/cases.csv" --batch 2 --seed 1
