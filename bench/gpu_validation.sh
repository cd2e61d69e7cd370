#!/usr/bin/env bash
# Real-GPU validation of the exporter (not run in CI: it needs an NVIDIA driver and GPU).
#
#   bench/gpu_validation.sh [OUTPUT_FILE]        (default: gpu-validation-<host>-<UTC time>.md)
#
# What it records, as markdown, for docs/gpu-validation.md:
#   1. the host: GPUs, driver, persistence mode, MIG mode (nvidia-smi);
#   2. gpupulse-exporter on real NVML: start-up time, which families appear (GPM support shows as
#      gpu_sm_active_ratio), collector success, promtool check, scrape latency (curl, 200 scrapes);
#   3. RSS and CPU of the exporter after VALIDATION_SOAK_SECONDS (default 120) at a 1 s interval;
#   4. bench/exporter.py --real: CPU per cycle of gpupulse vs a raw pynvml loop vs nvitop-exporter;
#   5. what nvidia_gpu_exporter pays per scrape: `nvidia-smi --query-gpu=... --format=csv`, timed 20x.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
OUT=${1:-gpu-validation-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ).md}
SOAK=${VALIDATION_SOAK_SECONDS:-120}
PORT=${VALIDATION_PORT:-19842}
URL="http://127.0.0.1:${PORT}"
PAIRS=${VALIDATION_PAIRS:-9}
# Extra exporter flags, e.g. "--simulate demo" to rehearse this script on a machine without a GPU.
read -r -a EXTRA_ARGS <<<"${VALIDATION_EXPORTER_ARGS:-}"

# Arithmetic in awk: bc is not on every GPU image.
calc() { awk "BEGIN { printf \"%.3f\", $1 }"; }

command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found: this script needs a GPU host" >&2; exit 2; }
command -v curl >/dev/null || { echo "curl is needed" >&2; exit 2; }

log() { echo "$*" | tee -a "$OUT"; }
block() { echo '```' >>"$OUT"; cat >>"$OUT"; echo '```' >>"$OUT"; }

: >"$OUT"
log "# GPU validation $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
log ""
log "## Host"
nvidia-smi --query-gpu=index,name,uuid,driver_version,persistence_mode,mig.mode.current,pci.bus_id \
  --format=csv | block
"$PY" -c 'import pynvml; print("nvidia-ml-py", pynvml.__file__)' | block

log "## Exporter on real NVML"
start=$(date +%s.%N)
"$PY" -m exporter.cli --web.listen-address "127.0.0.1:${PORT}" --log.format json "${EXTRA_ARGS[@]}" >"$OUT.exporter.log" 2>&1 &
EXPORTER=$!
trap 'kill "$EXPORTER" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  if curl -fsS "${URL}/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$EXPORTER" 2>/dev/null; then log "exporter exited:"; block <"$OUT.exporter.log"; exit 1; fi
  sleep 0.1
done
ready=$(date +%s.%N)
log "- ready after $(calc "$ready - $start") s"
sleep 3  # GPM needs two samples
curl -fsS "${URL}/metrics" >"$OUT.metrics"
log "- families exported: $(grep -c '^# TYPE' "$OUT.metrics")"
for family in gpu_sm_active_ratio gpu_sm_occupancy_ratio gpu_tensor_active_ratio gpu_dram_active_ratio \
  gpu_utilization_ratio gpu_memory_reserved_bytes gpu_memory_temperature_celsius gpu_thermal_margin_celsius \
  gpu_energy_joules_total gpu_clock_event_active gpu_nvlink_up gpu_nvlink_peer_info gpu_ecc_errors_total \
  gpu_remapped_rows_total gpu_process_memory_used_bytes gpu_process_sm_utilization_ratio gpu_mig_info; do
  log "  - ${family}: $(grep -c "^${family}[{ ]" "$OUT.metrics" || true) series"
done
log "- collector status:"
grep -E '^gpupulse_collector_(success|duration_seconds)' "$OUT.metrics" | block
if command -v promtool >/dev/null; then
  if promtool check metrics <"$OUT.metrics" >"$OUT.promtool" 2>&1; then log "- promtool check metrics: ok"
  else log "- promtool check metrics: FAILED"; block <"$OUT.promtool"; fi
fi

log "- scrape latency (curl time_total, 200 sequential scrapes, gzip):"
for _ in $(seq 1 200); do
  curl -s -o /dev/null --compressed -w '%{time_total}\n' "${URL}/metrics"
done | sort -n | awk '{a[NR]=$1} END {printf "  p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", a[int(NR*0.5)]*1000, a[int(NR*0.99)]*1000, a[NR]*1000}' | tee -a "$OUT"

log "- soaking ${SOAK} s (scraped every second)"
for _ in $(seq 1 "$SOAK"); do curl -s -o /dev/null "${URL}/metrics"; sleep 1; done
rss=$(awk '/VmRSS/ {print $2/1024}' "/proc/${EXPORTER}/status")
read -r utime stime < <(awk '{print $14, $15}' "/proc/${EXPORTER}/stat")
ticks=$(getconf CLK_TCK)
log "- RSS after soak: ${rss} MiB; CPU since start: $(calc "($utime + $stime) / $ticks") s"
kill -TERM "$EXPORTER"
wait "$EXPORTER" || true
trap - EXIT
log "- exporter log (last lines):"
tail -n 20 "$OUT.exporter.log" | block

log "## Benchmark on real NVML"
"$PY" bench/exporter.py --real --cycles 30 --duration 30 --pairs "$PAIRS" 2>"$OUT.bench.log" | tee -a "$OUT" ||
  { log "- bench/exporter.py failed; its stderr (last lines):"; tail -n 20 "$OUT.bench.log" | block; }

log "## nvidia-smi per scrape (what nvidia_gpu_exporter runs)"
QUERY=index,uuid,name,utilization.gpu,utilization.memory,memory.used,memory.total,temperature.gpu,power.draw,clocks.sm,clocks.mem,pstate
for _ in $(seq 1 20); do
  s=$(date +%s%N); nvidia-smi --query-gpu="$QUERY" --format=csv >/dev/null; e=$(date +%s%N)
  echo $(((e - s) / 1000))
done | sort -n | awk '{a[NR]=$1; t+=$1} END {printf "  nvidia-smi --query-gpu: mean %.1f ms, min %.1f ms, max %.1f ms (20 runs)\n", t/NR/1000, a[1]/1000, a[NR]/1000}' | tee -a "$OUT"

log ""
log "Raw files: $OUT.metrics, $OUT.exporter.log"
echo "wrote $OUT" >&2
