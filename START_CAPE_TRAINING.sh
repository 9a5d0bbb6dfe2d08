#!/usr/bin/env bash
# Launch episodic CAPE training with per-device defaults. Extra arguments go to the trainer and win
# over the defaults below (argparse keeps the last value given).
#
#   ./START_CAPE_TRAINING.sh                                # synthetic data (built on first use), auto device
#   MP100_ROOT=/data/mp100 ./START_CAPE_TRAINING.sh --split 2
#   ./START_CAPE_TRAINING.sh --epochs 1 --episodes_per_epoch 8     # smoke run
#   ./START_CAPE_TRAINING.sh --no-use_amp --device cpu
#   ./START_CAPE_TRAINING.sh --resume auto                 # continue the newest run with the same settings
#   MP100_ROOT=/data/mp100 ./START_CAPE_TRAINING.sh --eval_only --resume RUN/best.pt --split 1 \
#       --eval_set test --shots 1 --predictions_out preds.jsonl   # the papers' protocol, pck_report.json beside it
#
# Environment: PYTHON (default python3, else python), MP100_ROOT (an MP-100 folder with annotations/
# and images/; without it the synthetic MP-100-format dataset in data/synthetic_cape is used).
set -euo pipefail
cd "$(dirname "$0")"

die() { echo "START_CAPE_TRAINING: error: $*" >&2; exit 2; }

PYTHON="${PYTHON:-$(command -v python3 || command -v python || true)}"
[[ -n "$PYTHON" ]] && command -v "$PYTHON" >/dev/null || die "no python found: install Python 3.10+ or set PYTHON=/path/to/python"

# Flags the user passes that change what this script must decide.
REQUESTED_DEVICE=auto
USER_DATA_ROOT=""
prev=""
for arg in "$@"; do
  case "$prev" in
    --device) REQUESTED_DEVICE="$arg" ;;
    --data_root) USER_DATA_ROOT="$arg" ;;
  esac
  case "$arg" in
    --device=*) REQUESTED_DEVICE="${arg#*=}" ;;
    --data_root=*) USER_DATA_ROOT="${arg#*=}" ;;
  esac
  prev="$arg"
done

# One interpreter checks torch and picks the device: each start of one imports torch, a few seconds on a small CPU.
# --device cpu leaves nothing to pick, so then it only looks for torch, without importing it.
PICK_DEVICE="
import sys
try:
    import torch
except Exception:
    sys.exit(3)
import utils
from utils.device import DeviceError, select_device
try:
    print(select_device(sys.argv[1]).device.type)
except DeviceError as e:
    sys.exit(f'START_CAPE_TRAINING: {e}')
"
FIND_TORCH="
import importlib.util, sys
if importlib.util.find_spec('torch') is None:
    sys.exit(3)
print('cpu')
"
[[ "$REQUESTED_DEVICE" == cpu ]] && PROBE="$FIND_TORCH" || PROBE="$PICK_DEVICE"
DEVICE=$("$PYTHON" -c "$PROBE" "$REQUESTED_DEVICE") || {
  [[ $? == 3 ]] && die "$PYTHON cannot import torch: install the requirements (pip install -r requirements.txt)"
  exit 2
}

if [[ -n "$USER_DATA_ROOT" ]]; then
  DATA_ARGS=()
elif [[ -n "${MP100_ROOT:-}" ]]; then
  [[ -d "$MP100_ROOT/annotations" && -d "$MP100_ROOT/images" ]] ||
    die "MP100_ROOT=$MP100_ROOT needs annotations/ (mp100_split{1..5}_{train,val,test}.json) and images/; unset it to use synthetic data"
  DATA_ARGS=(--data_root "$MP100_ROOT")
else
  SYNTH=data/synthetic_cape
  if [[ ! -f "$SYNTH/annotations/mp100_split5_test.json" ]]; then
    echo "building the synthetic CAPE dataset in $SYNTH (about a minute) ..."
    "$PYTHON" scripts/build_synthetic_cape_dataset.py --output-dir "$SYNTH" || die "building $SYNTH failed"
  fi
  DATA_ARGS=(--data_root "$SYNTH")
fi

if [[ "$DEVICE" == cpu && -z "${OMP_NUM_THREADS:-}" ]]; then
  # Several multi-threaded processes on too few cores make OpenMP threads spin against each other:
  # measured here, a 2-thread run beside another busy one was ~15x slower than a 1-thread run.
  "$PYTHON" -c "
import os
load, cores = os.getloadavg()[0], os.cpu_count() or 1
if load > 0.75 * cores:
    print(f'note: the CPU is busy (load {load:.1f} on {cores} cores); if training crawls, rerun with OMP_NUM_THREADS=1')
" || true
fi

case "$DEVICE" in
  cuda|mps)
    # The CapeFormer paper recipe (models/cape/recipes.py): ResNet-50 at 256 px, Adam 1e-5, step decay, 200 epochs,
    # batch 16 (split into micro-batches by the hardware profile). ImageNet weights come from --backbone_weights
    # or the torchvision cache; --recipe pose_anything for the graph decoder on SwinV2-T.
    DEFAULTS=(--recipe capeformer) ;;
  *)
    # CPU quickstart, about 6 minutes on a 2-core AVX512-BF16 CPU (+25 s to build the data): capeformer_lite (the CapeFormer network
    # sized for a CPU, ResNet-18 at 128 px), 1 support + 8 queries per step (many small steps learn faster here
    # than the GPU's batch of 16), and a short protocol evaluation (the first episodes of the papers' draw).
    DEFAULTS=(--model capeformer_lite --image_size 128 --queries 8 --batch_size 1 --accumulation_steps 1
              --lr 2e-4 --lr_warmup_steps 100 --epochs 8 --episodes_per_epoch 200
              --val_episodes_per_category 2 --test_episodes_per_category 5 --log_interval 25) ;;
esac

# ${a[@]+"${a[@]}"}: an empty array is "unbound" under set -u in macOS's bash 3.2.
echo "device: $DEVICE; launching: $PYTHON -m models.train_cape_episodic ${DEFAULTS[*]} ${DATA_ARGS[*]+${DATA_ARGS[*]}} $*"
exec "$PYTHON" -m models.train_cape_episodic "${DEFAULTS[@]}" ${DATA_ARGS[@]+"${DATA_ARGS[@]}"} "$@"
