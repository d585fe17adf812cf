#!/usr/bin/env bash
# Session 20 run 1: wp-pingpong at 119c5b8 (few-heads v4 16 warps + layer v6 S turns): smoke tests,
# bench few_heads H=16/8 and the layers, ncu of the layer kernel.
set -uo pipefail
W=/tmp/r1; L=$W/logs; J=$W/json; mkdir -p $L $J; t0=$(date +%s); B=build-c6
T=$B/tests/swa_decode_tests; C=$B/tools/swa-decode
pack() { (cd $W && tar czf $OUT/r1.tgz logs json); }
sm() { echo "$1: $(grep -E '^\[  PASSED|^\[  FAILED|SUMMARY|^\[  SKIPPED \] [0-9]' $L/$1.log | tr '\n' ' ') $(tail -1 $L/$1.log)" >> $L/summary.txt; }
( SWA_DECODE_TEST_KERNEL=few_heads timeout 60 $T --gtest_filter='GpuDecode*:*GpuDecodeShapes*' > $L/fh_quick.log 2>&1; echo rc=$? >> $L/fh_quick.log ) &
( SWA_DECODE_TEST_KERNEL=sm90 timeout 90 $T --gtest_filter='GpuSm90Layer.*:GpuLayer.*' > $L/layer_quick.log 2>&1; echo rc=$? >> $L/layer_quick.log ) &
wait
sm fh_quick; sm layer_quick; grep -h -E "Failure|^\[  FAILED" -A3 $L/fh_quick.log $L/layer_quick.log | head -30 >> $L/summary.txt; pack
echo "smoke t=$(( $(date +%s)-t0 ))" >> $L/summary.txt
bn() { local tag=$1; shift
  timeout 90 $C bench "$@" --check-tokens 16 --json $J/$tag.json > $L/b_$tag.log 2>&1
  echo "== $tag t=$(( $(date +%s)-t0 ))" >> $L/summary.txt; grep -E "^ *[0-9]+ |error|Error" $L/b_$tag.log | cut -c1-110 >> $L/summary.txt; pack; }
if grep -q 'rc=0' $L/fh_quick.log; then
  bn v22_h16 --layer swa --heads 16 --tokens 1,8,32,128,512,2048 --kernel few_heads
  bn v22_h8 --layer swa --heads 8 --tokens 1,8,32,128,512,2048 --kernel few_heads
fi
if grep -q 'rc=0' $L/layer_quick.log; then
  bn v22_c4a_h128 --layer c4a --heads 128 --tokens 128,512,2048 --kernel sm90
  bn v22_c128a_64k_h128 --layer c128a --heads 128 --tokens 128,512,2048 --kernel sm90
  bn v22_c4a_h64 --layer c4a --heads 64 --tokens 128,512,2048 --kernel sm90
  timeout 120 ncu --clock-control none --launch-skip 2 --launch-count 1 -k "regex:layer" --set full --import-source no -o $W/logs/ncu_c4a $C bench --layer c4a --heads 128 --tokens 2048 --kernel sm90 --check-tokens 1 > $L/ncu.log 2>&1
  ncu --import $W/logs/ncu_c4a.ncu-rep --page details --csv > $L/ncu_details.csv 2>&1
  ncu --import $W/logs/ncu_c4a.ncu-rep --page source --csv --print-source sass > $L/ncu_sass.csv 2>&1
  rm -f $W/logs/ncu_c4a.ncu-rep; echo "ncu t=$(( $(date +%s)-t0 ))" >> $L/summary.txt
fi
echo "done t=$(( $(date +%s)-t0 ))" >> $L/summary.txt; pack; cat $L/summary.txt
