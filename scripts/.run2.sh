#!/usr/bin/env bash
# Session 20 run 2: wp-compact-ahead at 3cb1485 (layer v7: compaction loads ahead of its buffer wait;
# compact_columns split for every kernel): smoke, layer benches, ncu, then every GPU suite + sanitizers.
set -uo pipefail
W=/tmp/r2; L=$W/logs; J=$W/json; mkdir -p $L $J; t0=$(date +%s); B=build-c7
T=$B/tests/swa_decode_tests; C=$B/tools/swa-decode
pack() { (cd $W && tar czf $OUT/r2.tgz logs json); }
sm() { echo "$1: $(grep -E '^\[  PASSED|^\[  FAILED|SUMMARY|^\[  SKIPPED \] [0-9]' $L/$1.log | tr '\n' ' ') $(tail -1 $L/$1.log)" >> $L/summary.txt; }
( SWA_DECODE_TEST_KERNEL=sm90 timeout 90 $T --gtest_filter='GpuSm90Layer.*:GpuLayer.*' > $L/layer_quick.log 2>&1; echo rc=$? >> $L/layer_quick.log )
sm layer_quick; grep -h -E "Failure|^\[  FAILED" -A3 $L/layer_quick.log | head -30 >> $L/summary.txt; pack
if ! grep -q 'rc=0' $L/layer_quick.log; then tail -30 $L/layer_quick.log >> $L/summary.txt; pack; cat $L/summary.txt; exit 1; fi
bn() { local tag=$1; shift
  timeout 90 $C bench "$@" --check-tokens 16 --json $J/$tag.json > $L/b_$tag.log 2>&1
  echo "== $tag t=$(( $(date +%s)-t0 ))" >> $L/summary.txt; grep -E "^ *[0-9]+ |error|Error" $L/b_$tag.log | cut -c1-110 >> $L/summary.txt; pack; }
bn v23_c4a_h128 --layer c4a --heads 128 --tokens 128,512,2048 --kernel sm90
bn v23_c128a_64k_h128 --layer c128a --heads 128 --tokens 128,512,2048 --kernel sm90
bn v23_c4a_h64 --layer c4a --heads 64 --tokens 128,512,2048 --kernel sm90
bn v23_model1_c4a_h128 --layer c4a --format model1 --heads 128 --tokens 128,512,2048 --kernel sm90
timeout 120 ncu --clock-control none --launch-skip 2 --launch-count 1 -k "regex:layer" --set full --import-source no -o $W/logs/ncu_c4a $C bench --layer c4a --heads 128 --tokens 2048 --kernel sm90 --check-tokens 1 > $L/ncu.log 2>&1
ncu --import $W/logs/ncu_c4a.ncu-rep --page details --csv > $L/ncu_details.csv 2>&1
ncu --import $W/logs/ncu_c4a.ncu-rep --page source --csv --print-source sass > $L/ncu_sass.csv 2>&1
rm -f $W/logs/ncu_c4a.ncu-rep; echo "ncu t=$(( $(date +%s)-t0 ))" >> $L/summary.txt; pack
( timeout 250 $T --gtest_filter='*Gpu*' > $L/auto.log 2>&1; echo rc=$? >> $L/auto.log ) &
( SWA_DECODE_TEST_KERNEL=few_heads timeout 250 $T --gtest_filter='*Gpu*' > $L/fh.log 2>&1; echo rc=$? >> $L/fh.log ) &
( SWA_DECODE_TEST_KERNEL=sm90 timeout 250 $T --gtest_filter='*Gpu*' > $L/sm90.log 2>&1; echo rc=$? >> $L/sm90.log ) &
( SWA_DECODE_TEST_KERNEL=sm90 timeout 250 compute-sanitizer --tool memcheck $T --gtest_filter='GpuSm90Layer.*:LensRuleGpu.*' > $L/sm90_mem.log 2>&1; echo rc=$? >> $L/sm90_mem.log ) &
( SWA_DECODE_TEST_KERNEL=sm90 timeout 250 compute-sanitizer --tool racecheck $T --gtest_filter='GpuSm90Layer.*:LensRuleGpu.*' > $L/sm90_race.log 2>&1; echo rc=$? >> $L/sm90_race.log ) &
( SWA_DECODE_TEST_KERNEL=few_heads timeout 250 compute-sanitizer --tool memcheck $T --gtest_filter='GpuDecode*:LensRuleGpu.*:GpuChainedCalls.*' > $L/fh_mem.log 2>&1; echo rc=$? >> $L/fh_mem.log ) &
wait
for f in auto fh sm90 sm90_mem sm90_race fh_mem; do sm $f; done
grep -h "^\[  FAILED\|Failure" -A2 $L/auto.log $L/fh.log $L/sm90.log | head -30 >> $L/summary.txt
grep -h "random-configs: family=" $L/auto.log $L/fh.log $L/sm90.log | head -12 >> $L/summary.txt
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|hazard" $L/*_mem.log $L/*_race.log | sort | uniq -c | head >> $L/summary.txt
echo "done t=$(( $(date +%s)-t0 ))" >> $L/summary.txt; pack; cat $L/summary.txt
