#!/usr/bin/env bash
# One GPU slot (docs/gpu.md "One GPU slot"): `make gpu-check`, then the language-model sweep's `gpu` scale for the
# time left, then ONE archive of both output folders in SLOT_OUT. A slot returns at most 8 files from $OUT, so the
# outputs travel as one file (on 2026-11-28 a slot that copied the folders into $OUT lost the sweep's journal and the
# check's summary to that limit). Run from the repository root, normally as `make gpu-slot`.
#
#   SLOT_OUT      where gpu-slot.tar.gz and slot.log go (on the device machine: "$OUT")        default runs/slot
#   SLOT_S        seconds for the whole slot: the sweep gets what gpu-check leaves, less 90 s
#                 for the jobs running at its limit and the archive                            default 540
#   SLOT_WORKERS  sweep processes sharing the one GPU                                          default 16
#   SLOT_DRY      1: the plumbing on a CPU (gpu-check --dry-run; the sweep on the CPU, stopped
#                 before its first job)                                                        default 0
#   GPU_PY, GPU_CHECK_ARGS as for `make gpu-check`.
# Exit code: 0 when the archive was written (the steps' own codes are in slot.log), 2 on bad input.
set -uo pipefail
out=${SLOT_OUT:-runs/slot}
total=${SLOT_S:-540}
workers=${SLOT_WORKERS:-16}
dry=${SLOT_DRY:-0}
py=${GPU_PY:-python3}
sweep=runs/lm-sweep-gpu
die() { echo "gpu-slot: error: $*" >&2; exit 2; }
[[ $total =~ ^[0-9]+$ ]] || die "SLOT_S must be a whole number of seconds, got '$total'"
[[ $workers =~ ^[1-9][0-9]*$ ]] || die "SLOT_WORKERS must be a positive whole number, got '$workers'"
[[ $dry == 0 || $dry == 1 ]] || die "SLOT_DRY must be 0 or 1, got '$dry'"
[[ -f $sweep/data/meta.json ]] || die "$sweep/data/meta.json is missing: prepare the sweep's tokens on a machine with \
the corpus first (docs/gpu.md: lm-sweep --scale gpu --out $sweep --time-limit 0.001) and carry $sweep"
mkdir -p "$out" || die "cannot make SLOT_OUT $out"
log="$out/slot.log"
if [[ $dry == 1 ]]; then gpu=runs/gpu-dry; else gpu=runs/gpu; fi
start=$(date +%s)
{
  echo "gpu-slot: $(date -u +%FT%TZ), SLOT_S $total, workers $workers, dry $dry"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  PYTHONPATH=src "$py" -m difftransformer.gpucheck.gpu_check run $([[ $dry == 1 ]] && echo --dry-run) --out "$gpu" \
    ${GPU_CHECK_ARGS:-}
  echo "gpu-check exit $? after $(( $(date +%s) - start )) s"
  left=$(( total - ($(date +%s) - start) - 90 ))
  if [[ $dry == 1 ]]; then limit=0.001 device=cpu workers=1; else limit=$left device=cuda; fi
  if (( left >= 30 )); then
    # Our own limit, not the machine's: whatever the sweep does, the archive below is still written.
    timeout -k 10 $(( left + 60 )) env PYTHONPATH=src "$py" -m difftransformer lm-sweep --scale gpu --device $device \
      --workers "$workers" --time-limit "$limit" --no-progress --out "$sweep"
    echo "lm-sweep exit $? (75: stopped at --time-limit, resumable; 124: killed by the slot's own limit)"
  else
    echo "lm-sweep not started: $left s left after gpu-check"
  fi
  echo "gpu-slot: $(( $(date +%s) - start )) s"
} 2>&1 | tee "$log"
tar -czf "$out/gpu-slot.tar.gz" "$gpu" "$sweep" -C "$out" slot.log || die "could not write $out/gpu-slot.tar.gz"
echo "gpu-slot: wrote $out/gpu-slot.tar.gz ($(du -h "$out/gpu-slot.tar.gz" | cut -f1))"
