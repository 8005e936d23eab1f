#!/usr/bin/env bash
# issue 39: the encode rows of octopus / octopus-qjl at b=2,3,4 (live-quarters search, main), then end to end
# with the live-quarters encode, with the model-work ceiling (batch / (copies + rest))
set -u
T0=$(date +%s); log=/tmp/r/log.txt
mkdir -p /tmp/r
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $log; ( cd /tmp/r && tar czf $OUT/pack.tgz . 2>/dev/null ); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $log
echo "tree: $(cat .gpu/commit)" >> $log
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 130 python3 -m octopus_audio bench --suite full --codecs octopus,octopus-qjl --bits 2,3,4 --rep-ms 20 \
  --no-attention --out /tmp/r/enc > /tmp/r/enc_log.txt 2>&1
say "encode bench rc=$?"
timeout 440 python3 benchmarks/bench_patch.py --out /tmp/r/patch --graphs none,none+patch,octopus --eager '' \
  --budget none+patch@graph,octopus@graph,none@graph --checks profile \
  --profile none+patch@graph:256,octopus@graph:256,none@graph:256,octopus@graph:576 --memcheck '' \
  --batches 64,256 --deadline-s 370 > /tmp/r/patch_log.txt 2>&1
say "patch rc=$?"
say end
