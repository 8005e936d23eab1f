#!/usr/bin/env bash
# issue 39: end to end after codec none's sink-scale fix (none+patch reads its store as one preallocated
# buffer again), octopus in the same call; profiles at 256 and at octopus's budget batch
set -u
T0=$(date +%s); log=/tmp/r/log.txt
mkdir -p /tmp/r
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $log; ( cd /tmp/r && tar czf $OUT/pack.tgz . 2>/dev/null ); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $log
echo "tree: $(cat .gpu/commit)" >> $log
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 400 python3 benchmarks/bench_patch.py --out /tmp/r/patch --graphs none,none+patch,octopus --eager '' \
  --budget none+patch@graph,octopus@graph,none@graph --checks profile \
  --profile none+patch@graph:256,octopus@graph:256,none+patch@graph:224,octopus@graph:528 --memcheck '' \
  --batches 64,256 --deadline-s 330 > /tmp/r/patch_log.txt 2>&1
say "patch rc=$?"
timeout 150 python3 benchmarks/bench_patch.py --out /tmp/r/patch_b1 --graphs none+patch,octopus --eager '' \
  --budget '' --checks '' --memcheck '' --batches 1 --deadline-s 120 > /tmp/r/patch_b1_log.txt 2>&1
say "patch B=1 rc=$?"
say end
