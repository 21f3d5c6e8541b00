#!/usr/bin/env bash
# The checks a lent GPU machine is for, in one run (issues 42 and 44), each bounded in time
# and writing under $OUT (default: a temporary folder) as it goes:
#   1. the GPU inventory and readings against nvidia-smi (scripts/check_nvml.py);
#   2. the largest model that trains on the GPU, with and without offload, and capped at an
#      H100 80GB's memory (benchmarks/largest_model.py);
#   3. the built-in trainer sharded on the GPU with offload and activation checkpointing,
#      one worker, then resumed from its sharded checkpoint;
#   4. memory and throughput per strategy at one worker (benchmarks/large_model.py);
#   5. per-GPU training and inference rates of the seeds' sizing models (ResNet-50 and -152,
#      224 px, AMP and channels_last), measured as `deeppod size --measure` measures them;
#   6. what Resizer.interruptible's hooks cost a GPU step (benchmarks/resize_hooks.py);
#   7. the runtime's training loop against bare PyTorch under torchrun, one GPU
#      (benchmarks/train_throughput.py).
# Needs only PyTorch, torchvision, Pillow and nvidia-ml-py beside this checkout.
#     OUT=/tmp/out bash scripts/gpu_checks.sh
# SECTIONS="1 3" runs only those; LARGEST_ARGS adds arguments to section 2's benchmark;
# HOOKS_SPECS="resnet50,32,100,12 ..." sets section 6's runs (model,batch[,steps,rounds]).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
SECTIONS=${SECTIONS:-1 2 3 4 5 6 7}
on() { [[ " $SECTIONS " == *" $1 "* ]]; }
nvidia-smi -L; $PY -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
free -g | head -2

images() {
    $PY - "$1" <<'PYTHON'
import sys
from pathlib import Path

import numpy as np
from PIL import Image

root, rng = Path(sys.argv[1]), np.random.default_rng(0)
for c in range(3):
    (root / f"c{c}").mkdir(parents=True)
    for i in range(60):
        Image.fromarray((rng.random((64, 64, 3)) * 80 + c * 60).astype("uint8")).save(root / f"c{c}" / f"{i}.png")
PYTHON
}

trainer() {
    local work epochs
    work=$(mktemp -d)
    images "$work/images"
    for epochs in 1 2; do
        DEEPPOD_CHECKPOINT_DIR=$work/ckpt timeout 90 $PY -m deeppod.runtime.trainers.image_classifier \
            --data "$work/images" --model resnet50 --image-size 64 --batch-size 32 --epochs $epochs --strategy fsdp \
            --offload --activation-checkpointing --output "$work/model" 2>&1 | tee -a "$OUT/trainer.txt"
        echo "exit ${PIPESTATUS[0]}; checkpoints: $(ls "$work/ckpt" | tr '\n' ' ')" | tee -a "$OUT/trainer.txt"
    done
    ls "$work/model" | tee -a "$OUT/trainer.txt"
}

if on 1; then
    echo "== 1. inventory and readings against nvidia-smi"
    timeout 60 $PY scripts/check_nvml.py --out "$OUT/nvml.json" 2>&1 | tee "$OUT/nvml.txt"
fi
if on 3; then
    echo "== 3. the trainer, sharded and offloaded, resumed"
    trainer
fi
if on 2; then
    echo "== 2. the largest model"
    # shellcheck disable=SC2086  # LARGEST_ARGS is words
    timeout "${LARGEST_S:-300}" $PY benchmarks/largest_model.py --budget-s "${BUDGET_S:-40}" ${LARGEST_ARGS:-} \
        --out "$OUT/largest.json" 2>&1 | tee "$OUT/largest.txt"
fi
if on 4; then
    echo "== 4. strategies at one worker"
    timeout "${STRATEGIES_S:-90}" $PY benchmarks/large_model.py --workers 1 --width 4096 --layers 8 --seq 2048 \
        --batch 1 --steps 3 --rounds 1 --out "$OUT/large_model.json" 2>&1 | tee "$OUT/large_model.txt"
fi
if on 5; then
    echo "== 5. per-GPU rates for sizing"
    timeout "${RATES_S:-240}" $PY - "$OUT/rates.json" <<'PYTHON' 2>&1 | tee "$OUT/rates.txt"
import json
import sys

from deeppod.bench.train import run_workers, summarize

out = []
for model in ("resnet50", "resnet152"):
    for forward_only in (False, True):
        args = ["--model", model, "--batch-size", "256", "--image-size", "224", "--steps", "30"]
        r = summarize(run_workers(1, args + (["--forward-only"] if forward_only else [])))
        row = {"model": model, "inference" if forward_only else "training": r["images_per_second_total"]}
        print(json.dumps(row), flush=True)
        out.append(row)
open(sys.argv[1], "w").write(json.dumps(out, indent=1))
PYTHON
fi
if on 6; then
    echo "== 6. the interruptible hooks' cost on a GPU step"
    # each "model batch [steps rounds]"; batch 32 is host-bound (a step of 20-30 ms on an H200)
    n=0
    for spec in ${HOOKS_SPECS:-"resnet50,256" "resnet50,32,100,12" "resnet18,256"}; do
        IFS=, read -r model batch steps rounds <<< "$spec"
        n=$((n + 1))
        timeout "${HOOKS_S:-240}" $PY benchmarks/resize_hooks.py --model "$model" --batch-size "$batch" \
            --steps "${steps:-${HOOKS_STEPS:-40}}" --rounds "${rounds:-7}" \
            --out "$OUT/hooks_${n}_${model}_${batch}.json" 2>&1 | tee -a "$OUT/hooks.txt"
    done
fi
if on 7; then
    echo "== 7. training loop: the runtime against bare PyTorch, one GPU"
    timeout "${TRAIN_S:-300}" $PY benchmarks/train_throughput.py --workers 1 --batch-size 256 --steps 30 --rounds 3 \
        2>&1 | tee "$OUT/train_throughput.txt"
fi
echo "== done"
