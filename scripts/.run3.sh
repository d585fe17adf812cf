#!/usr/bin/env bash
# Session 20 run 3: layer v8 at 9a92651 (a pair computes S once) against v7 (cab5887, build-c7 CLI):
# smoke, A/B layer benches, then GPU suites + sanitizers on v8, ncu.
set -uo pipefail
W=/tmp/r3; L=$W/logs; J=$W/json; mkdir -p $L $J; t0=$(date +%s); B=build-c8
T=$B/tests/swa_decode_tests; C=$B/tools/swa-decode; C7=build-c7/tools/swa-decode
pack() { (cd $W && tar czf $OUT/r3.tgz logs json); }
sm() { echo "$1: $(grep -E '^\[  PASSED|^\[  FAILED|SUMMARY|^\[  SKIPPED \] [0-9]' $L/$1.log | tr '\n' ' ') $(tail -1 $L/$1.log)" >> $L/summary.txt; }
( SWA_DECODE_TEST_KERNEL=sm90 timeout 90 $T --gtest_filter='GpuSm90Layer.*:GpuLayer.*' > $L/layer_quick.log 2>&1; echo rc=$? >> $L/layer_quick.log )
sm layer_quick; grep -h -E "Failure|^\[  FAILED|^\[ RUN" -A3 $L/layer_quick.log | tail -40 >> $L/summary.txt; pack
if ! grep -q 'rc=0' $L/layer_quick.log; then tail -30 $L/layer_quick.log >> $L/summary.txt; pack; cat $L/summary.txt; exit 1; fi
bn() { local cli=$1 tag=$2; shift 2
  timeout 90 $cli bench "$@" --check-tokens 16 --json $J/$tag.json > $L/b_$tag.log 2>&1
  echo "== $tag t=$(( $(date +%s)-t0 ))" >> $L/summary.txt; grep -E "^ *[0-9]+ |error|Error" $L/b_$tag.log | cut -c1-110 >> $L/summary.txt; pack; }
bn $C v24_c4a_h128 --layer c4a --heads 128 --tokens 128,512,2048 --kernel sm90
bn $C7 v23b_c4a_h128 --layer c4a --heads 128 --tokens 128,512,2048 --kernel sm90
bn $C v24_c128a_64k_h128 --layer c128a --heads 128 --tokens 128,512,2048 --kernel sm90
bn $C7 v23b_c128a_64k_h128 --layer c128a --heads 128 --tokens 128,512,2048 --kernel sm90
bn $C v24_model1_c4a_h128 --layer c4a --format model1 --heads 128 --tokens 128,512,2048 --kernel sm90
bn $C7 v23b_model1_c4a_h128 --layer c4a --format model1 --heads 128 --tokens 128,512,2048 --kernel sm90
( SWA_DECODE_TEST_KERNEL=sm90 timeout 200 $T --gtest_filter='*Gpu*' > $L/sm90.log 2>&1; echo rc=$? >> $L/sm90.log ) &
( timeout 200 $T --gtest_filter='*Gpu*' > $L/auto.log 2>&1; echo rc=$? >> $L/auto.log ) &
( SWA_DECODE_TEST_KERNEL=sm90 timeout 200 compute-sanitizer --tool racecheck $T --gtest_filter='GpuSm90Layer.*:LensRuleGpu.*' > $L/sm90_race.log 2>&1; echo rc=$? >> $L/sm90_race.log ) &
( SWA_DECODE_TEST_KERNEL=sm90 timeout 200 compute-sanitizer --tool memcheck $T --gtest_filter='GpuSm90Layer.*:LensRuleGpu.*' > $L/sm90_mem.log 2>&1; echo rc=$? >> $L/sm90_mem.log ) &
( SWA_DECODE_TEST_KERNEL=sm90 timeout 200 compute-sanitizer --tool synccheck $T --gtest_filter='GpuSm90Layer.*' > $L/sm90_sync.log 2>&1; echo rc=$? >> $L/sm90_sync.log ) &
wait
for f in sm90 auto sm90_race sm90_mem sm90_sync; do sm $f; done
grep -h "^\[  FAILED\|Failure" -A2 $L/auto.log $L/sm90.log | head -30 >> $L/summary.txt
grep -h "random-configs: family=.*ran=\|kernel=sm90_wgmma_layer" $L/auto.log $L/sm90.log | head -8 >> $L/summary.txt
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|hazard" $L/*_mem.log $L/*_race.log $L/*_sync.log | sort | uniq -c | head >> $L/summary.txt
echo "tests t=$(( $(date +%s)-t0 ))" >> $L/summary.txt; pack
timeout 100 ncu --clock-control none --launch-skip 2 --launch-count 1 -k "regex:layer" --set full --import-source no -o $W/logs/ncu_c4a $C bench --layer c4a --heads 128 --tokens 2048 --kernel sm90 --check-tokens 1 > $L/ncu.log 2>&1
ncu --import $W/logs/ncu_c4a.ncu-rep --page details --csv > $L/ncu_details.csv 2>&1
ncu --import $W/logs/ncu_c4a.ncu-rep --page source --csv --print-source sass > $L/ncu_sass.csv 2>&1
rm -f $W/logs/ncu_c4a.ncu-rep
echo "done t=$(( $(date +%s)-t0 ))" >> $L/summary.txt; pack; cat $L/summary.txt
