#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over hk_forward on small generated
# inputs that hit the tails (S of 7, 33 and 129; D of 100, 128, 136 and 256; head dims 8, 25, 64, 136
# and 256; lengths 0, 1 and S in every batch), once per route the choosers can pick:
#   tune0        HK_TUNE=0: every decision at its default
#   tune1        HK_TUNE=1 with no cache: every candidate of every decision is measured, so each
#                one runs under the tool (its timings mean nothing there)
#   flash, flash.q16, flash.q64, flash.k2, flash.k4, flash.g4, cudnn   HK_ATTENTION pinned (HK_TUNE=0)
#   epilogue     HK_GELU=epilogue (HK_TUNE=0)
#   chains-off   HK_CHAINS=off with HK_TUNE=1: the tuned plan of single-step kernels
#   post_attn_qkv, post_attn_qkv-pack1   HK_CHAINS=post_attn_qkv (HK_TUNE=0), dense and HK_PACK=1 (D = F = 128 input)
#   attention_chain   HK_CHAINS=attention_chain (HK_TUNE=0): the chain with the attention in front (S = 48 inputs)
#   attention_model   HK_CHAINS=attention_model (HK_TUNE=0): those chains as one whole-model kernel (S = 48 inputs)
#   graph0       HK_GRAPH=0: eager launches
#   pack1, pack1-tune1   HK_PACK=1: padding-free (packed) forward, untuned and tuned
#   fp32, fp32-tune1     --precision fp32
# Runs go in priority order (every route on the smallest input under every tool first; racecheck
# is slow, so it only gets the smallest input), several at a time on the one GPU, each under a
# timeout, and none starts once the time budget is spent.
#
# Usage: perf/device/sanitize.sh <pkg-bin-dir> <work-dir> <log-file>
#   <pkg-bin-dir> holds hk_forward and hk_generate (their libraries in <pkg-bin-dir>/../lib or on
#   LD_LIBRARY_PATH); <work-dir> is created; <log-file> gets every run's line, the errors of the
#   runs that reported any, and the summary. Stdout: one line per run, then the summary.
# Environment:
#   HK_SAN_BUDGET   seconds for the whole script (default 360)
#   HK_SAN_JOBS     runs at a time (default: half the CPUs, 2..8)
#   HK_SAN_TOOLS    tools to run (default "memcheck racecheck synccheck initcheck")
#   HK_SAN_ROUTES   only these routes (space-separated names as above; default: all)
#   HK_SAN_TIMEOUT  per-run limit in seconds (default 120; racecheck 150), cut to the budget left
#   COMPUTE_SANITIZER  the compute-sanitizer executable (default: PATH, then /usr/local/cuda/bin)
# Exit status: 0 when no run reported an error or failed; 1 otherwise; 2 on a usage or setup
# error. Runs cut by their timeout or never started for lack of time count as "not completed",
# reported separately, and do not make the exit status non-zero. Racecheck runs whose hazards all
# lie inside cuDNN's own generated kernels are counted apart ("only in cuDNN's kernels", their
# logs kept) and do not fail the script either: that is library code, not hk's.
set -u

if [ $# -ne 3 ]; then
  echo "usage: $0 <pkg-bin-dir> <work-dir> <log-file>" >&2
  exit 2
fi
bin=$(cd "$1" 2>/dev/null && pwd) || { echo "sanitize.sh: $1: no such directory" >&2; exit 2; }
work=$2
log=$3
for exe in hk_forward hk_generate; do
  [ -x "$bin/$exe" ] || { echo "sanitize.sh: $bin/$exe: not found" >&2; exit 2; }
done
if [ -d "$bin/../lib" ]; then
  lib=$(cd "$bin/../lib" && pwd)
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
san=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
if [ ! -x "$san" ]; then
  echo "sanitize.sh: compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2
  exit 2
fi
# Only the knobs each route sets below: nothing inherited from the caller's environment.
unset HK_TUNE HK_TUNE_CACHE HK_TUNE_REMEASURE HK_TUNE_VERBOSE HK_ATTENTION HK_GELU HK_GEMM_LAYOUT HK_GEMM_ALGO \
  HK_CHAINS HK_GRAPH HK_PACK HK_CUDA_POISON
mkdir -p "$work/in" "$work/out" "$work/logs" "$work/res" || exit 2
rm -f "$work"/res/* "$work"/logs/* "$work"/out/*
: > "$log" || exit 2

budget=${HK_SAN_BUDGET:-360}
ncpu=$(nproc 2>/dev/null || echo 4)
jobs_max=${HK_SAN_JOBS:-$(( ncpu / 2 < 2 ? 2 : (ncpu / 2 > 8 ? 8 : ncpu / 2) ))}
tools=${HK_SAN_TOOLS:-memcheck racecheck synccheck initcheck}
start=$(date +%s)
deadline=$(( start + budget ))

say() { echo "$*" | tee -a "$log"; }
say "sanitize.sh: $("$san" --version 2>/dev/null | grep -m1 -i version), budget ${budget}s, $jobs_max runs at a time, tools: $tools"

# ---- inputs: name -> hk_generate arguments (one file holds the model and the input) ------------
declare -A shape_args shape_desc
shape_args[tiny]="--batch 3 --seq 7 --d-model 136 --heads 17 --ffn 100 --layers 1 --causal 1 --lengths-list 0,1,S"
shape_desc[tiny]="S=7 D=136 hd=8 causal"
# B*S = 297 rows with at most 232 valid: HK_PACK=1 packs it into 256 rows.
shape_args[mid]="--batch 9 --seq 33 --d-model 136 --heads 1 --ffn 72 --layers 2 --causal 0 --lengths-list 0,1,S"
shape_desc[mid]="S=33 D=136 hd=136 bidir"
shape_args[long]="--batch 3 --seq 129 --d-model 256 --heads 4 --ffn 100 --layers 1 --causal 1 --lengths-list 0,1,S"
shape_desc[long]="S=129 D=256 hd=64 causal"
shape_args[hd256]="--batch 2 --seq 33 --d-model 256 --heads 1 --ffn 64 --layers 1 --causal 1 --lengths-list 1,S"
shape_desc[hd256]="S=33 D=256 hd=256 causal"
# head_dim 25: the fp32 routes only (the f16 kernels take multiples of 8).
shape_args[d100]="--batch 3 --seq 33 --d-model 100 --heads 4 --ffn 136 --layers 1 --causal 0 --lengths-list 0,1,S"
shape_desc[d100]="S=33 D=100 hd=25 bidir"
# Within the whole-model kernel's limits (D 64, F 48, S <= 128, head_dim 8).
shape_args[small]="--batch 3 --seq 33 --d-model 64 --heads 8 --ffn 48 --layers 2 --causal 1 --lengths-list 0,1,S"
shape_desc[small]="S=33 D=64 hd=8 causal"
# D = F = 128 exactly: the column-split post-attention kernels (shared-memory and register
# weights) are tuning candidates only there (and at 64); tune1 runs every candidate.
shape_args[split]="--batch 5 --seq 33 --d-model 128 --heads 4 --ffn 128 --layers 2 --causal 1 --lengths-list 0,1,S"
shape_desc[split]="S=33 D=F=128 hd=32 causal"
# The same model with more row blocks (~620) than the column-split kernels have CTAs: their
# persistent loops reuse the shared tiles (the QKV chain's f tile between row blocks).
shape_args[split-big]="--batch 300 --seq 33 --d-model 128 --heads 4 --ffn 128 --layers 2 --causal 1 --lengths-list 0,1,S"
shape_desc[split-big]="S=33 D=F=128 hd=32 causal, 9900 rows"
# The attention chain's shapes (S a multiple of 16): clusters of 3 CTAs, one and several passes of
# the grid over the sequences.
shape_args[attn]="--batch 5 --seq 48 --d-model 128 --heads 4 --ffn 128 --layers 3 --causal 1 --lengths-list 0,1,S"
shape_desc[attn]="S=48 D=F=128 hd=32 causal"
shape_args[attn-big]="--batch 200 --seq 48 --d-model 128 --heads 4 --ffn 128 --layers 2 --causal 0 --lengths-list 0,1,S"
shape_desc[attn-big]="S=48 D=F=128 hd=32, 200 sequences"
for s in tiny mid long hd256 d100 small split split-big attn attn-big; do
  # shellcheck disable=SC2086
  if ! "$bin/hk_generate" ${shape_args[$s]} --seed 11 --quiet --output "$work/in/$s.h5" >> "$log" 2>&1; then
    say "sanitize.sh: hk_generate failed for $s (${shape_args[$s]})"
    exit 2
  fi
done

# ---- routes: name -> environment and hk_forward options -------------------------------------------
declare -A route_env route_opt
route_env[tune0]="HK_TUNE=0";                                      route_opt[tune0]="--precision fast"
route_env[tune1]="HK_TUNE=1 HK_TUNE_CACHE=off HK_TUNE_VERBOSE=1";  route_opt[tune1]="--precision fast"
route_env[flash]="HK_TUNE=0 HK_ATTENTION=flash";                   route_opt[flash]="--precision fast"
route_env[flash.q16]="HK_TUNE=0 HK_ATTENTION=flash.q16";           route_opt[flash.q16]="--precision fast"
route_env[flash.q64]="HK_TUNE=0 HK_ATTENTION=flash.q64";           route_opt[flash.q64]="--precision fast"
route_env[flash.k2]="HK_TUNE=0 HK_ATTENTION=flash.k2";             route_opt[flash.k2]="--precision fast"
route_env[flash.k4]="HK_TUNE=0 HK_ATTENTION=flash.k4";             route_opt[flash.k4]="--precision fast"
route_env[flash.g4]="HK_TUNE=0 HK_ATTENTION=flash.g4";             route_opt[flash.g4]="--precision fast"
route_env[cudnn]="HK_TUNE=0 HK_ATTENTION=cudnn";                   route_opt[cudnn]="--precision fast"
route_env[epilogue]="HK_TUNE=0 HK_GELU=epilogue";                  route_opt[epilogue]="--precision fast"
route_env[chains-off]="HK_TUNE=1 HK_TUNE_CACHE=off HK_TUNE_VERBOSE=1 HK_CHAINS=off"
route_opt[chains-off]="--precision fast"
route_env[graph0]="HK_TUNE=0 HK_GRAPH=0";                          route_opt[graph0]="--precision fast"
route_env[pack1]="HK_TUNE=0 HK_PACK=1";                            route_opt[pack1]="--precision fast"
route_env[pack1-tune1]="HK_TUNE=1 HK_TUNE_CACHE=off HK_TUNE_VERBOSE=1 HK_PACK=1"
route_opt[pack1-tune1]="--precision fast"
route_env[persistent]="HK_TUNE=0 HK_CHAINS=persistent";             route_opt[persistent]="--precision fast"
route_env[post_attn_qkv]="HK_TUNE=0 HK_CHAINS=post_attn_qkv";       route_opt[post_attn_qkv]="--precision fast"
route_env[post_attn_qkv-pack1]="HK_TUNE=0 HK_CHAINS=post_attn_qkv HK_PACK=1"
route_opt[post_attn_qkv-pack1]="--precision fast"
route_env[attention_chain]="HK_TUNE=0 HK_CHAINS=attention_chain"; route_opt[attention_chain]="--precision fast"
route_env[attention_model]="HK_TUNE=0 HK_CHAINS=attention_model"; route_opt[attention_model]="--precision fast"
route_env[materialized]="HK_TUNE=0 HK_ATTENTION=materialized";       route_opt[materialized]="--precision fast"
route_env[fp32]="HK_TUNE=0";                                       route_opt[fp32]="--precision fp32"
route_env[fp32-tune1]="HK_TUNE=1 HK_TUNE_CACHE=off HK_TUNE_VERBOSE=1"
route_opt[fp32-tune1]="--precision fp32"
all_routes="tune0 tune1 cudnn flash.q16 flash.q64 epilogue chains-off graph0 pack1 pack1-tune1 fp32 fp32-tune1 flash"
fast_routes="tune0 tune1 cudnn flash.q16 flash.q64 epilogue chains-off graph0 pack1 pack1-tune1 flash"

# ---- the run list, in priority order: "tool route shape" ------------------------------------------
has_tool() { [[ " $tools " == *" $1 "* ]]; }
runs=()
want_route() { [ -z "${HK_SAN_ROUTES:-}" ] || [[ " $HK_SAN_ROUTES " == *" $1 "* ]]; }
add() { has_tool "$1" && want_route "$2" && runs+=("$1 $2 $3"); }
for tool in memcheck racecheck synccheck initcheck; do
  add $tool tune1 split
  add $tool pack1-tune1 split
  # The chain with the next layer's QKV projection, pinned (D = F = 128 only).
  add $tool post_attn_qkv split
  add $tool post_attn_qkv-pack1 split
  # The chain with the attention in front, pinned (dense; D = F = 128 with head_dim 32 here), and
  # tuned on its shape (the tuner runs it and its front variant among the candidates).
  add $tool attention_chain attn
  add $tool attention_model attn
  add $tool tune1 attn
done
for tool in memcheck racecheck synccheck initcheck; do
  for r in $all_routes; do add $tool "$r" tiny; done
  # Routes only a pin reaches for sure (tune1 measures them only where they are candidates).
  add $tool persistent small
  add $tool materialized tiny
done
# The key-split attention routes only on shapes they take (head_dim 32 and 64; S 33 and 129: ranks
# without key tiles, and tiles shared out over the cluster); elsewhere a pin falls back to flash.
for tool in memcheck racecheck synccheck initcheck; do
  add $tool flash.k4 split
  add $tool flash.k2 long
  add $tool flash.k4 long
done
# The head-group route on a shape it takes (head_dim 8, 8 heads: two groups per sequence).
for tool in memcheck racecheck synccheck initcheck; do add $tool flash.g4 small; done
# The QKV chain's persistent loop (pinned: its default configuration; tune1: every candidate).
add memcheck post_attn_qkv split-big
add memcheck tune1 split-big
add racecheck post_attn_qkv split-big
add memcheck attention_chain attn-big
add racecheck attention_chain attn-big
add memcheck attention_model attn-big
add racecheck attention_model attn-big
for r in $all_routes; do add memcheck "$r" mid; done
for r in $all_routes; do add memcheck "$r" long; done
for r in fp32 fp32-tune1; do add memcheck $r d100; add initcheck $r d100; done
for r in tune0 tune1 cudnn flash.q16 pack1; do add memcheck $r hd256; done
for r in $all_routes; do add initcheck "$r" mid; done
for r in $fast_routes; do add synccheck "$r" mid; done

if [ ${#runs[@]} -eq 0 ]; then
  say "sanitize.sh: no runs for HK_SAN_TOOLS='$tools' HK_SAN_ROUTES='${HK_SAN_ROUTES:-}' (a misspelt name?)"
  exit 2
fi

# ---- one run (in the background): writes res/<i> = "status|seconds|detail" -------------------------
run_one() {
  local i=$1 tool=$2 route=$3 shape=$4 limit=$5
  local rlog="$work/logs/$i-$tool-$route-$shape.log" t0 rc status detail n
  t0=$(date +%s)
  # In its own process group: timeout signals only the tool, and a tool stopped at its limit can
  # leave its target (hk_forward) running on the GPU, where it would share the GPU with whatever
  # runs next (the benchmarks of the same device call). The whole group goes once the run ends.
  # shellcheck disable=SC2086
  setsid env ${route_env[$route]} timeout -k 10 "$limit" "$san" --tool "$tool" --error-exitcode 99 \
    "$bin/hk_forward" --backend cuda ${route_opt[$route]} --no-fork-validate --quiet \
    --input "$work/in/$shape.h5" --output "$work/out/$i.h5" > "$rlog" 2>&1 &
  local group=$!
  wait "$group"
  rc=$?
  kill -KILL -- "-$group" 2>/dev/null
  rm -f "$work/out/$i.h5"
  local secs=$(( $(date +%s) - t0 ))
  detail=$(grep -m1 -E "ERROR SUMMARY|RACECHECK SUMMARY" "$rlog" | sed 's/^========= //')
  case $rc in
    0)
      # racecheck counts warnings apart from errors; --error-exitcode fires on errors only
      if grep -qE "ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards|RACECHECK SUMMARY: .*\(0 errors" "$rlog"; then
        status=ok
      else  # exit 0 without the tool's summary: the tool did not check what it should have
        status=failed
        detail="exit 0 but no clean summary: $(tail -1 "$rlog")"
      fi ;;
    99) status=ERRORS
        # Hazards that racecheck reports only inside cuDNN's own generated kernels (library code,
        # WGMMA/TMA kernels) are kept apart: listed, counted, not hk's to fix.
        if [ "$tool" = racecheck ] && grep -q "Race reported between" "$rlog" &&
           ! grep "Race reported between" "$rlog" | grep -vq "access at cudnn_generated"; then
          status=library
        fi
        detail="$detail; first: $(grep -m1 -E "^========= +(Invalid|Uninitialized|Race|Barrier|Error|Program hit|Malloc|Leaked|Warp|Cuda API)" "$rlog" | sed 's/^========= *//' | cut -c1-160)" ;;
    124|137) status=timeout; detail="stopped after ${limit}s (not completed)" ;;
    *)  status=failed
        detail="exit $rc: $(grep -m1 -E "hk_forward: error|=========.*(Error|error)" "$rlog" | cut -c1-200)" ;;
  esac
  n=$(grep -c "^hk tune:" "$rlog" 2>/dev/null)
  [ "${n:-0}" -gt 0 ] && detail="$n tuning decisions; $detail"
  echo "$status|$secs|$detail" > "$work/res/$i"
  printf "%-10s %-12s %-6s %-26s %-8s %4ss  %s\n" "$tool" "$route" "$shape" "${shape_desc[$shape]}" "$status" "$secs" \
    "$detail" | tee -a "$log"
}

say "$(printf "%-10s %-12s %-6s %-26s %-8s %5s  %s" tool route input shape result time detail)"
tool_limit() {
  local base=${HK_SAN_TIMEOUT:-120}
  [ "$1" = racecheck ] && [ -z "${HK_SAN_TIMEOUT:-}" ] && base=150
  echo "$base"
}
i=0
for spec in "${runs[@]}"; do
  i=$((i + 1))
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n 2>/dev/null || sleep 1; done
  read -r tool route shape <<< "$spec"
  left=$(( deadline - $(date +%s) - 12 ))  # room for the kill grace of a timeout
  limit=$(tool_limit "$tool")
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 20 ]; then  # not enough time left for a meaningful run
    echo "not-started|0|time budget spent" > "$work/res/$i"
    printf "%-10s %-12s %-6s %-26s %-8s %4ss  %s\n" "$tool" "$route" "$shape" "${shape_desc[$shape]}" "skipped" 0 \
      "not started: the ${budget}s budget is spent" | tee -a "$log"
    continue
  fi
  run_one "$i" "$tool" "$route" "$shape" "$limit" &
done
wait
# Nothing of this script may outlive it: any hk_forward still reading this script's inputs is a
# target its tool left behind.
stray=$(pgrep -f -c -- "--input $work/in/")
if [ "${stray:-0}" -gt 0 ]; then
  pkill -KILL -f -- "--input $work/in/"
  say "sanitize.sh: killed $stray process(es) left running by stopped runs"
fi

# ---- errors of the runs that reported any, then the summary ----------------------------------------
for f in "$work"/logs/*.log; do
  [ -e "$f" ] || continue
  idx=$(basename "$f" | cut -d- -f1)
  st=$(cut -d'|' -f1 "$work/res/$idx" 2>/dev/null)
  if [ "$st" = ERRORS ] || [ "$st" = failed ] || [ "$st" = library ]; then
    { echo "---- $(basename "$f" .log): $st"; grep -v "^hk tune:" "$f" | head -60; } >> "$log"
  fi
done
summary() {
  local what=$1 ok=0 err=0 fail=0 tout=0 nst=0 lib=0 j spec st
  for j in $(seq 1 ${#runs[@]}); do
    spec=${runs[$((j - 1))]}
    [ -n "$what" ] && [ "${spec%% *}" != "$what" ] && continue
    st=$(cut -d'|' -f1 "$work/res/$j" 2>/dev/null || echo not-started)
    case $st in
      ok) ok=$((ok + 1)) ;; ERRORS) err=$((err + 1)) ;; timeout) tout=$((tout + 1)) ;; library) lib=$((lib + 1)) ;;
      not-started|"") nst=$((nst + 1)) ;; *) fail=$((fail + 1)) ;;
    esac
  done
  echo "$ok $err $fail $tout $nst $lib"
}
say "summary ($(( $(date +%s) - start ))s):"
for tool in $tools; do
  read -r ok err fail tout nst lib <<< "$(summary "$tool")"
  say "$(printf "  %-10s %3d ok, %d with errors, %d failed, %d not completed (%d timed out, %d not started), %d only in cuDNN's kernels" \
    "$tool" "$ok" "$err" "$fail" $((tout + nst)) "$tout" "$nst" "$lib")"
done
read -r ok err fail tout nst lib <<< "$(summary "")"
say "$(printf "  %-10s %3d ok, %d with errors, %d failed, %d not completed (%d timed out, %d not started) of %d runs" \
  all "$ok" "$err" "$fail" $((tout + nst)) "$tout" "$nst" ${#runs[@]})"
if [ $((err + fail)) -gt 0 ]; then
  say "sanitize.sh: FAILED ($err run(s) with sanitizer errors, $fail run(s) failed; details in $log)"
  exit 1
fi
say "sanitize.sh: no errors reported$([ $((tout + nst)) -gt 0 ] && echo "; $((tout + nst)) run(s) not completed")"
exit 0
