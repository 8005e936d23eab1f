#!/usr/bin/env bash
# issue 39: branch sdpa-empty-store (a call with no compressed key runs SDPA over the native keys: AAR's first
# scale leaves the score-table kernel) against main (.mainF = main's product code at 04ae49b): the patch's
# attention scale by scale and octopus end to end on each tree, then the compiled tests of the changed paths
set -u
T0=$(date +%s); log=/tmp/r/log.txt; ROOT=$PWD
mkdir -p /tmp/r
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $log; ( cd /tmp/r && tar czf $OUT/pack.tgz . 2>/dev/null ); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $log
echo "tree: $(cat .gpu/commit)" >> $log
export PYTHONUNBUFFERED=1
S=(--batch 256 --rep-ms 30)
PYTHONPATH=$ROOT timeout 70 python3 benchmarks/lab/time_scale_attention.py "${S[@]}" --out /tmp/r/scales_branch.json > /tmp/r/scales_branch_log.txt 2>&1; say "branch scales rc=$?"
( cd .mainF && PYTHONPATH=$ROOT/.mainF timeout 70 python3 benchmarks/lab/time_scale_attention.py "${S[@]}" --out /tmp/r/scales_main.json > /tmp/r/scales_main_log.txt 2>&1 ); say "main scales rc=$?"
E=(--eager "" --budget "" --memcheck "" --reps 3 --checks "" --batches 64,256 --deadline-s 80)
PYTHONPATH=$ROOT timeout 100 python3 benchmarks/bench_patch.py --out /tmp/r/branch --graphs none+patch,octopus "${E[@]}" > /tmp/r/branch_log.txt 2>&1; say "branch e2e rc=$?"
( cd .mainF && PYTHONPATH=$ROOT/.mainF timeout 90 python3 benchmarks/bench_patch.py --out /tmp/r/main --graphs octopus "${E[@]}" > /tmp/r/main_log.txt 2>&1 ); say "main e2e rc=$?"
N=""; python3 -c "import xdist" 2>/dev/null && N="-n 14"
PYTHONPATH=$ROOT OCTOPUS_AUDIO_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q $N -p no:cacheprovider tests/test_kernels_native.py tests/test_cache_prefix.py tests/test_cache_fused.py > /tmp/r/compiled_tests.txt 2>&1
say "compiled tests rc=$?"; tail -3 /tmp/r/compiled_tests.txt >> $log
say end
