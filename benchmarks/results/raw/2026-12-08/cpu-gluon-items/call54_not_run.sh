#!/usr/bin/env bash
# issue 39, branch gluon-items (the working tree): the Gluon kernel's programs serving several (row, head)
# items (flash.PROGRAMS_PER_SM) against one program an item, scale by scale in the patch's cache (B = 256,
# 64), then the compiled tests of the kernel (both launches). Prepared on the CPU, not run.
set -u
T0=$(date +%s); log=/tmp/r/log.txt; ROOT=$PWD
mkdir -p /tmp/r
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $log; ( cd /tmp/r && tar czf $OUT/pack.tgz . 2>/dev/null ); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log
echo "tree: $(git rev-parse HEAD 2>/dev/null || cat .gpu/commit)" >> $log
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT
for p in 2 3; do
  timeout 90 python3 benchmarks/lab/time_scale_attention.py --batch 256 --rep-ms 30 --items $p --out /tmp/r/scales_256_items$p.json > /tmp/r/scales_256_items${p}_log.txt 2>&1; say "scales 256 items $p rc=$?"
done
timeout 70 python3 benchmarks/lab/time_scale_attention.py --batch 64 --rep-ms 30 --items 2 --out /tmp/r/scales_64_items2.json > /tmp/r/scales_64_items2_log.txt 2>&1; say "scales 64 items 2 rc=$?"
N=""; python3 -c "import xdist" 2>/dev/null && N="-n 14"
OCTOPUS_AUDIO_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q $N -p no:cacheprovider tests/test_kernels_gluon.py tests/test_cache_wide.py tests/test_cache_prefix.py > /tmp/r/compiled_tests.txt 2>&1
say "compiled tests rc=$?"; tail -3 /tmp/r/compiled_tests.txt >> $log
say end
