#!/usr/bin/env bash
# issue 39 at the current tree: end to end with the budget search (octopus, none+patch; B = 64, 256), then the
# patch's attention scale by scale at B=256 if time remains
set -u
T0=$(date +%s); log=/tmp/r/log.txt
mkdir -p /tmp/r
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $log; ( cd /tmp/r && tar czf $OUT/pack.tgz . 2>/dev/null ); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $log
echo "tree: $(cat .gpu/commit)" >> $log
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 170 python3 benchmarks/bench_patch.py --out /tmp/r/patch --graphs none+patch,octopus --eager '' \
  --budget none+patch@graph,octopus@graph --checks '' --memcheck '' --batches 64,256 --reps 3 \
  --deadline-s 160 > /tmp/r/patch_log.txt 2>&1
say "patch rc=$?"
timeout 70 python3 benchmarks/lab/time_scale_attention.py --batch 256 --rep-ms 30 --out /tmp/r/scales_256.json > /tmp/r/scales_256_log.txt 2>&1; say "scales 256 rc=$?"
say end
