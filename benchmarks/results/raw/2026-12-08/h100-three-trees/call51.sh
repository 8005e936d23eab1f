#!/usr/bin/env bash
# issue 39, three trees in one call: main (.mainF), branch early-encode (.stageF: a unit encoded into the
# store when it enters the window, on a side stream) and branch sdpa-empty-store (the working tree: a call with
# no compressed key runs SDPA). End to end (graph path, B = 64, 256) for each, then the compiled tests of each
# branch's changed paths, then the scales on the sdpa branch. Steps in priority order; none starts after 470 s.
set -u
T0=$(date +%s); log=/tmp/r/log.txt; ROOT=$PWD
mkdir -p /tmp/r
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $log; ( cd /tmp/r && tar czf $OUT/pack.tgz . 2>/dev/null ); }
late() { [ $(( $(date +%s) - T0 )) -gt 470 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $log
echo "tree: $(cat .gpu/commit) (sdpa-empty-store); early-encode: $(cat .gpu/commit_stage); main: 64b1d1c" >> $log
for t in .mainF .stageF; do cp -r octopus_audio/default_model $t/octopus_audio/; done
export PYTHONUNBUFFERED=1
E=(--eager "" --budget "" --memcheck "" --reps 3 --checks "" --batches 64,256 --deadline-s 90)
( cd .stageF && PYTHONPATH=$ROOT/.stageF timeout 110 python3 benchmarks/bench_patch.py --out /tmp/r/early --graphs none+patch,octopus "${E[@]}" > /tmp/r/early_log.txt 2>&1 ); say "early e2e rc=$?"
( cd .mainF && PYTHONPATH=$ROOT/.mainF timeout 90 python3 benchmarks/bench_patch.py --out /tmp/r/main --graphs octopus "${E[@]}" > /tmp/r/main_log.txt 2>&1 ); say "main e2e rc=$?"
N=""; python3 -c "import xdist" 2>/dev/null && N="-n 14"
late || { ( cd .stageF && PYTHONPATH=$ROOT/.stageF OCTOPUS_AUDIO_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q $N -p no:cacheprovider tests/test_cache_early.py tests/test_cache_fused.py > /tmp/r/early_tests.txt 2>&1 ); say "early compiled tests rc=$?"; tail -3 /tmp/r/early_tests.txt >> $log; }
late || { PYTHONPATH=$ROOT timeout 90 python3 benchmarks/bench_patch.py --out /tmp/r/sdpa --graphs octopus "${E[@]}" > /tmp/r/sdpa_log.txt 2>&1; say "sdpa e2e rc=$?"; }
late || { PYTHONPATH=$ROOT OCTOPUS_AUDIO_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q $N -p no:cacheprovider tests/test_kernels_native.py tests/test_cache_prefix.py > /tmp/r/sdpa_tests.txt 2>&1; say "sdpa compiled tests rc=$?"; tail -3 /tmp/r/sdpa_tests.txt >> $log; }
late || { PYTHONPATH=$ROOT timeout 70 python3 benchmarks/lab/time_scale_attention.py --batch 256 --rep-ms 30 --out /tmp/r/scales_sdpa.json > /tmp/r/scales_sdpa_log.txt 2>&1; say "sdpa scales rc=$?"; }
say end
