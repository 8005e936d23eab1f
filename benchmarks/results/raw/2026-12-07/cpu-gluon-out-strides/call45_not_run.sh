#!/usr/bin/env bash
# issue 39: the Gluon attention storing rows in [B, T, H, D] order (branch gluon-out-strides) against main
# (.mainE): compiled Gluon value tests, then octopus end to end at B=256 on each tree
set -u
T0=$(date +%s); log=/tmp/r/log.txt; ROOT=$PWD
mkdir -p /tmp/r
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $log; ( cd /tmp/r && tar czf $OUT/pack.tgz . 2>/dev/null ); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log
echo "tree: $(cat .gpu/commit)" >> $log
export PYTHONUNBUFFERED=1
N=""; python3 -c "import xdist" 2>/dev/null && N="-n 14"
PYTHONPATH=$ROOT OCTOPUS_AUDIO_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q $N -p no:cacheprovider tests/test_kernels_gluon.py -k "matches_library_decode or cache_attend" > /tmp/r/compiled_tests_gluon.txt 2>&1
say "compiled gluon tests rc=$?"; tail -3 /tmp/r/compiled_tests_gluon.txt >> $log
B=(--graphs octopus --eager "" --budget "" --checks "" --memcheck "" --batches 256 --deadline-s 40)
PYTHONPATH=$ROOT timeout 45 python3 benchmarks/bench_patch.py --out /tmp/r/branch "${B[@]}" > /tmp/r/branch_log.txt 2>&1; say "branch e2e rc=$?"
( cd .mainE && PYTHONPATH=$ROOT/.mainE timeout 45 python3 benchmarks/bench_patch.py --out /tmp/r/main "${B[@]}" > /tmp/r/main_log.txt 2>&1 ); say "main e2e rc=$?"
say end
