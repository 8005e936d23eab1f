#!/bin/bash
# issue 17: the persistent Gluon kernel: compiled gluon tests, tile cost, bench AAR rows. $1 = commit
H=$PWD
export PYTHONPATH=$H OCTOPUS_AUDIO_COMMIT=$1
for p in kernels aar_patch eval; do ln -sfn $H/$p $H/octopus_audio/$p; done
t() { local s=$(date +%s.%N); "$@"; local rc=$?; echo "TIME $(python3 -c "import time;print(round(time.time()-$s,1))") s rc=$rc: $*"; }
mkdir -p $OUT/raw
t timeout 150 env OCTOPUS_AUDIO_TEST_DEVICE=cuda python3 -m pytest -q -x -n 16 -p no:cacheprovider tests/test_kernels_gluon.py 2>&1 | tail -15 | tee $OUT/raw/compiled_gluon_tests.txt
t timeout 60 python3 benchmarks/lab/gluon_tile_cost.py --out $OUT/raw/tile_cost_q75.json 2>&1 | tail -9
t timeout 200 python3 -m octopus_audio bench --suite quick --codecs all --bits 2 --no-encode --rep-ms 20 --out $OUT/bench 2>&1 | tail -3
grep -i "AAR B=64\|AAR B=512" $OUT/bench/bench.md | head -30
