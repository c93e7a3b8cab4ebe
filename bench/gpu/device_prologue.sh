# Sourced by bench/gpu/*.sh device scripts: strict mode, the repository on PYTHONPATH, OUT (where
# results go: $OUT on the device machine, .device_out here) and a log's header (the commit in
# SOURCE_SHA, the GPU, the date).
#   . bench/gpu/device_prologue.sh; device_header "$OUT/name.log"
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/.device_out}
mkdir -p "$OUT"

device_header() {
  { cat SOURCE_SHA 2>/dev/null; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u; } \
    | tee "$1"
}
