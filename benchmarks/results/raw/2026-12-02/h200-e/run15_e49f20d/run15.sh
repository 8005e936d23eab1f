#!/bin/bash
# issue 16: rows finished beside the next generation + teacher forcing's one pass encoding with the kernels.
# $1 = commit. The 100-clip full-size eval cold+warm, the default eval cold+warm, compiled tests of the change.
H=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$H:/tmp/site OCTOPUS_AUDIO_COMMIT=$1
for p in kernels aar_patch eval; do ln -sfn $H/$p $H/octopus_audio/$p; done
t() { local s=$(date +%s.%N); "$@"; local rc=$?; echo "TIME $(python3 -c "import time;print(round(time.time()-$s,1))") s rc=$rc: $*"; }
mkdir -p $OUT/raw
t timeout 280 python3 benchmarks/bench_eval.py --work /tmp/be100 --clips 100 --out $OUT/bench_eval100.md --commit $1 2>&1 | tail -4
export TRITON_CACHE_DIR=/tmp/tc_default
t timeout 100 python3 benchmarks/bench_eval.py --stage-run $OUT/raw/default_cold.json -- eval --out /tmp/dcold --no-progress 2>&1 | tail -1
t timeout 40 python3 benchmarks/bench_eval.py --stage-run $OUT/raw/default_warm.json -- eval --out /tmp/dwarm --no-progress 2>&1 | tail -1
cat $OUT/raw/*.json
unset TRITON_CACHE_DIR
t timeout 90 env OCTOPUS_AUDIO_TEST_DEVICE=cuda python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cache_fused.py tests/test_compile_ahead.py -k "attend_sequence or cuda_generation or teacher_forcing" 2>&1 | tail -3 | tee $OUT/raw/compiled_tests.txt
