#!/usr/bin/env bash
# issue 39: the Gluon attention storing rows in [B, T, H, D] order (branch gos2, main + that change) against
# main (.mainE): octopus end to end (B=64, 256, best of 3, profile at 256), AAR-shape attention rows, then the
# compiled tests of the changed kernel and of the cache paths that read its output
set -u
T0=$(date +%s); log=/tmp/r/log.txt; ROOT=$PWD
mkdir -p /tmp/r
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $log; ( cd /tmp/r && tar czf $OUT/pack.tgz . 2>/dev/null ); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $log
echo "tree: $(cat .gpu/commit)" >> $log
export PYTHONUNBUFFERED=1
E=(--eager "" --budget "" --memcheck "" --reps 3 --checks profile --profile octopus@graph:256 --batches 64,256 --deadline-s 80)
PYTHONPATH=$ROOT timeout 110 python3 benchmarks/bench_patch.py --out /tmp/r/branch --graphs none+patch,octopus "${E[@]}" > /tmp/r/branch_log.txt 2>&1; say "branch e2e rc=$?"
( cd .mainE && PYTHONPATH=$ROOT/.mainE timeout 90 python3 benchmarks/bench_patch.py --out /tmp/r/main --graphs octopus "${E[@]}" > /tmp/r/main_log.txt 2>&1 ); say "main e2e rc=$?"
PYTHONPATH=$ROOT timeout 60 python3 benchmarks/lab/bench_aar_rows.py --out /tmp/r/aar_branch --codecs octopus > /tmp/r/aar_branch_log.txt 2>&1; say "branch aar rows rc=$?"
( cd .mainE && PYTHONPATH=$ROOT/.mainE timeout 60 python3 benchmarks/lab/bench_aar_rows.py --out /tmp/r/aar_main --codecs octopus > /tmp/r/aar_main_log.txt 2>&1 ); say "main aar rows rc=$?"
N=""; python3 -c "import xdist" 2>/dev/null && N="-n 14"
PYTHONPATH=$ROOT OCTOPUS_AUDIO_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q $N -p no:cacheprovider tests/test_kernels_gluon.py tests/test_cache_wide.py tests/test_cache_prefix.py > /tmp/r/compiled_tests.txt 2>&1
say "compiled tests rc=$?"; tail -3 /tmp/r/compiled_tests.txt >> $log
say end
