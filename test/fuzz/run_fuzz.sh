#!/usr/bin/env bash
# Bounded fuzzing of the HDF5 contract readers: usage run_fuzz.sh <hk_fuzz_contract> <seconds> <work dir>
# New corpus units go to <work dir>/corpus (test/fuzz/corpus is only read). A finding whose
# sanitizer/libFuzzer stack reaches hk's code (src/hk, test/fuzz) before libhdf5 fails the run;
# one that happens inside libhdf5 first is a library bug hk cannot prevent (hk_forward contains
# it with its forked validation): it is kept under <work dir>/libhdf5/ and fuzzing goes on.
set -uo pipefail
fuzzer=$1 budget=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work/corpus" "$work/artifacts" "$work/libhdf5"
export LSAN_OPTIONS="suppressions=$here/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
end=$(( $(date +%s) + budget ))
while :; do
  left=$(( end - $(date +%s) ))
  [ "$left" -ge 5 ] || break
  log="$work/last.log"
  rm -f "$work"/artifacts/*
  "$fuzzer" -max_total_time="$left" -timeout=10 -rss_limit_mb=2048 -max_len=32768 \
    -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/corpus" "$here/corpus" >"$log" 2>&1
  rc=$?
  grep -E '^(stat::|Done|#[0-9]+ +DONE)' "$log" | tail -3
  [ "$rc" -eq 0 ] && break
  artifact=$(ls "$work"/artifacts/* 2>/dev/null | head -1)
  # The first stack frame that is hk's own code or libhdf5 decides.
  first=$(grep -E '^ +#[0-9]+ ' "$log" | grep -oE 'libhdf5[^ )]*|/src/hk/[^ ]*\.[ch]pp|/test/fuzz/[^ ]*\.cpp' | head -1)
  if [[ -n "$artifact" && "$first" == libhdf5* ]]; then
    echo "fuzz: a crash inside libhdf5 (not hk's code): kept as $work/libhdf5/$(basename "$artifact")"
    grep -m1 -E 'ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error' "$log"
    mv "$artifact" "$work/libhdf5/"
    continue
  fi
  echo "fuzz: a finding in hk's code (exit $rc); input: ${artifact:-none}"
  cat "$log" | grep -vE '^#[0-9]+ +(NEW|REDUCE|pulse)|NEW_FUNC' | tail -60
  exit 1
done
echo "fuzz: no finding in hk's code in ${budget} s; libhdf5 findings: $(ls "$work/libhdf5" | wc -l)"
