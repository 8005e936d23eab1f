#!/bin/bash
# issue 17 final call of session 10: encode (triplet search tables), score tables for the scalar section, Gluon window
# tiles with tile a alone, the preallocated-none baseline. $1 = commit
H=$PWD
export PYTHONPATH=$H OCTOPUS_AUDIO_COMMIT=$1
for p in kernels aar_patch eval; do ln -sfn $H/$p $H/octopus_audio/$p; done
t() { local s=$(date +%s.%N); "$@"; local rc=$?; echo "TIME $(python3 -c "import time;print(round(time.time()-$s,1))") s rc=$rc: $*"; }
mkdir -p $OUT/raw
t timeout 170 env OCTOPUS_AUDIO_TEST_DEVICE=cuda python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_kernels_encode.py tests/test_kernels_adc.py tests/test_kernels_gluon.py tests/test_cache_fused.py "tests/test_kernels_attention.py::test_scalar_single_row_paths_agree" 2>&1 | grep -v Warning | tail -8 | tee $OUT/raw/compiled_tests.txt
t timeout 170 python3 -m octopus_audio bench --suite quick --codecs all --bits 2 --tune --rep-ms 20 --out $OUT/bench 2>&1 | tail -2
t timeout 70 python3 -m octopus_audio bench --suite full --codecs octopus,octopus-qjl,polarquant,turboquant-qjl --bits 3,4 --no-attention --rep-ms 20 --out $OUT/bench_enc 2>&1 | tail -2
t timeout 110 python3 benchmarks/bench_patch.py --out $OUT/patch --graphs none,none+patch,octopus --eager '' --budget none@graph,none+patch@graph,octopus@graph --checks '' --memcheck '' --batches 64,256 --deadline-s 90 2>&1 | tail -12
rm -f $OUT/bench/rows_partial.json $OUT/bench_enc/rows_partial.json
grep -E "^\| (attention|encode)" $OUT/bench/bench.md | awk -F'|' '{print $3,"|",$4,"|",$5,"|",$9,"|",$10,"|",$11,"|",$16}' | head -60
