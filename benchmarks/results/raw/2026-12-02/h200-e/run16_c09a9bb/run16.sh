#!/bin/bash
# issue 17 probes + issue 16 generate: tile cost of the Gluon kernel; generate cold/warm; bench_patch e2e. $1 = commit
H=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$H:/tmp/site OCTOPUS_AUDIO_COMMIT=$1
for p in kernels aar_patch eval; do ln -sfn $H/$p $H/octopus_audio/$p; done
t() { local s=$(date +%s.%N); "$@"; local rc=$?; echo "TIME $(python3 -c "import time;print(round(time.time()-$s,1))") s rc=$rc: $*"; }
mkdir -p $OUT/raw
t timeout 150 python3 benchmarks/lab/gluon_tile_cost.py --out $OUT/raw/tile_cost_q75.json 2>&1 | tail -12
t timeout 60 python3 benchmarks/lab/gluon_tile_cost.py --tq 64 --codecs octopus --lengths 0,380,1532 --out $OUT/raw/tile_cost_q64.json 2>&1 | tail -5
export TRITON_CACHE_DIR=/tmp/tc_gen
t timeout 60 python3 -m octopus_audio generate --codec octopus --bits 2 --out /tmp/g0 2>&1 | tail -2
t timeout 30 python3 -m octopus_audio generate --codec octopus --bits 2 --out /tmp/g1 2>&1 | tail -1
t timeout 30 python3 -m octopus_audio generate --codec octopus --bits 2 --out /tmp/g2 2>&1 | tail -1
t timeout 30 python3 -c "import torch; torch.zeros(1, device='cuda')"
unset TRITON_CACHE_DIR
t timeout 230 python3 benchmarks/bench_patch.py --out $OUT/patch --graphs none,none+patch,octopus --eager '' --budget none@graph,none+patch@graph,octopus@graph --checks '' --memcheck '' --batches 64,256 --deadline-s 200 2>&1 | tail -30
