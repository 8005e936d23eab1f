#!/usr/bin/env bash
# issue 39: branch sdpa-small (the working tree: a call with no compressed key over at most 64 native keys runs
# SDPA with its memory-efficient backend first, ahead of the Gluon kernel) against main (.mainF, 64b1d1c): the
# patch's attention scale by scale (B = 256, 64), end to end (graph path), the stronger uncompressed baseline
# (time_none_small.py), the compiled tests of the changed paths; on an H200, run66's encode table refreshed.
set -u
T0=$(date +%s); log=/tmp/r/log.txt; ROOT=$PWD
mkdir -p /tmp/r
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $log; ( cd /tmp/r && tar czf $OUT/pack.tgz . 2>/dev/null ); }
late() { [ $(( $(date +%s) - T0 )) -gt 480 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $log
echo "tree: $(cat .gpu/commit) (sdpa-small); main: 64b1d1c (.mainF)" >> $log
cp -r octopus_audio/default_model .mainF/octopus_audio/
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT
timeout 70 python3 benchmarks/lab/time_scale_attention.py --batch 256 --rep-ms 30 --out /tmp/r/scales_256.json > /tmp/r/scales_256_log.txt 2>&1; say "scales 256 rc=$?"
E=(--eager "" --budget "" --memcheck "" --reps 3 --checks "" --batches 64,256 --deadline-s 90)
timeout 110 python3 benchmarks/bench_patch.py --out /tmp/r/small --graphs none+patch,octopus "${E[@]}" > /tmp/r/small_log.txt 2>&1; say "small e2e rc=$?"
( cd .mainF && PYTHONPATH=$ROOT/.mainF timeout 90 python3 benchmarks/bench_patch.py --out /tmp/r/main --graphs octopus "${E[@]}" > /tmp/r/main_log.txt 2>&1 ); say "main e2e rc=$?"
late || { timeout 120 python3 benchmarks/lab/time_none_small.py --batches 64,256 --out /tmp/r/none_small.json > /tmp/r/none_small_log.txt 2>&1; say "none small rc=$?"; }
N=""; python3 -c "import xdist" 2>/dev/null && N="-n 14"
late || { OCTOPUS_AUDIO_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q $N -p no:cacheprovider tests/test_kernels_native.py tests/test_cache_prefix.py tests/test_cache_wide.py "tests/test_kernels_gluon.py::test_cache_attend_runs_gluon" "tests/test_kernels_gluon.py::test_cache_attend_with_a_native_prefix_runs_gluon" "tests/test_kernels_gluon.py::test_cache_attend_with_a_wide_prefix_runs_gluon" > /tmp/r/compiled_tests.txt 2>&1; say "compiled tests rc=$?"; tail -3 /tmp/r/compiled_tests.txt >> $log; }
late || { timeout 60 python3 benchmarks/lab/time_scale_attention.py --batch 64 --rep-ms 30 --out /tmp/r/scales_64.json > /tmp/r/scales_64_log.txt 2>&1; say "scales 64 rc=$?"; }
if [ $(( $(date +%s) - T0 )) -lt 330 ]; then
  timeout 170 python3 benchmarks/bench_patch.py --out /tmp/r/budget --graphs none+patch,octopus --eager '' --budget none+patch@graph,octopus@graph --checks '' --memcheck '' --batches 64,256 --reps 3 --deadline-s 160 > /tmp/r/budget_log.txt 2>&1; say "budget rc=$?"
fi
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && ! late; then
  timeout 100 python3 -m octopus_audio bench --suite full --codecs all --bits 2,3,4 --rep-ms 20 --no-attention --out /tmp/r/encode > /tmp/r/encode_log.txt 2>&1
  say "encode table rc=$?"
fi
say end
