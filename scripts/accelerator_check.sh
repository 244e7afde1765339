#!/usr/bin/env bash
# Everything that needs a GPU or NPU, in one call, each point against the CPU; summaries into OUTDIR.
#
#   scripts/accelerator_check.sh DEVICE OUTDIR [--quick]
#
# DEVICE: cuda | cuda:N | npu | npu:N (cpu: a dry run of every step on the CPU alone, as CI runs it with --quick).
# Steps (each a Hydra sweep with tracking=none, its summary.{md,csv,json} under OUTDIR/<step>/):
#   1 points      the default per-point checks (mode=action) on cpu and DEVICE x fp32, fp16, bf16
#   2 precision, fingerprint, stats: on cpu and DEVICE x fp32, fp16, bf16
#   3 benchmark   backend=eager,compile,graphs on cpu and DEVICE, batch 1 .. 65536, with LoadGen's single_stream,
#                 multi_stream, offline and server scenarios and the control loop on that backend
#   4 fixtures-*  the shipped ML-Agents fixtures (pyramids, huggy_lstm; $HUGGY_EXP_SHARED or ../shared/fixtures/mlagents)
#                 through precision and the benchmark scenarios on cpu and DEVICE
# Budget: about 7 minutes on a GPU (each step has a time limit: STEP_LIMIT_S, default 150 s). --quick: two batch sizes,
# fp32 and bf16, millisecond LoadGen runs and a 0.2 s control loop (the CPU dry run: about a minute here).
# Exit status: 0 when every step ran and every verdict was as expected, else the first failing step's status.
# On a lent GPU: docs/loadgen-and-control-loop.md ("Running on an accelerator").
set -uo pipefail

if [ $# -lt 2 ]; then
    echo "usage: scripts/accelerator_check.sh DEVICE OUTDIR [--quick]" >&2
    exit 2
fi
device="$1"
out="$2"
quick="${3:-}"
case "$device" in
    cpu|cuda|cuda:[0-9]*|npu|npu:[0-9]*) ;;
    *) echo "error: unknown DEVICE '$device'; valid: cpu, cuda, cuda:N, npu, npu:N" >&2; exit 2 ;;
esac
if [ -n "$quick" ] && [ "$quick" != "--quick" ]; then
    echo "error: unknown option '$quick'; valid: --quick" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
limit="${STEP_LIMIT_S:-150}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
devices="cpu,$device"
[ "$device" = cpu ] && devices=cpu
shared="${HUGGY_EXP_SHARED:-../shared/fixtures/mlagents}"

if [ -n "$quick" ]; then
    dtypes="fp32,bf16"
    ladder="[1,64]"
    bench=(mode.rounds=1 mode.budget_s=0.05 mode.warmup_s=0.01 mode.settle_s=0 mode.min_duration_ms=50
           mode.min_query_count=64 mode.qsl_samples=64 mode.check_samples=16 mode.search_steps=2 mode.search_ms=50
           mode.duration_s=0.2 mode.loop_search_s=0.1 mode.rate_hz=100 mode.latency_bound_ms=1000 obs.rows=16)
    steps=(obs.rows=16 mode.steps=8)
    backends="eager"  # compile on the CPU spends ~30 s compiling per shape: the GPU run covers it
else
    dtypes="fp32,fp16,bf16"
    ladder="[1,8,64,512,4096,65536]"
    bench=(mode.rounds=2 mode.budget_s=0.4 mode.warmup_s=0.2 mode.min_duration_ms=1000 mode.search_steps=5
           mode.search_ms=400 mode.duration_s=2 mode.loop_search_s=0.5 mode.rate_hz=1000)
    steps=()
    backends="eager,compile,graphs"
fi
scenarios="mode.scenarios=[single_stream,multi_stream,offline,server,control_loop]"
status=0
report="$out/SUMMARY.md"
{
    echo "# accelerator check: $device ($(date -u '+%Y-%m-%d %H:%M UTC'))"
    echo
    echo "host $(uname -n), $("$python" -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1)${quick:+, --quick}"
} > "$report"

step() {  # step NAME ARGS...: one sweep into OUTDIR/NAME, its summary appended to SUMMARY.md
    local name="$1"
    shift
    local started=$SECONDS rc
    timeout --kill-after=10 "$limit" "$python" run.py -m tracking=none "$@" "hydra.sweep.dir=$out/$name" \
        > "$out/$name.log" 2>&1
    rc=$?
    {
        echo
        echo "## $name: exit $rc in $((SECONDS - started)) s"
        [ "$rc" -eq 124 ] && echo "(stopped at the step limit of $limit s)"
        echo
        echo '`python run.py -m tracking=none '"$*"'`'
        echo
        if [ -f "$out/$name/summary.md" ]; then
            tail -n +3 "$out/$name/summary.md" | sed "s|](\([^)/]*\.png\))|]($name/\1)|"  # plots: in the step's folder
        else
            tail -n 5 "$out/$name.log"
        fi
    } >> "$report"
    echo "$name: exit $rc in $((SECONDS - started)) s ($out/$name)"
    [ "$status" -eq 0 ] && [ "$rc" -ne 0 ] && status=$rc
    return 0
}

step points "device=$devices" "dtype=$dtypes" obs.rows=64
step precision mode=precision "device=$devices" "dtype=$dtypes" obs.rows=64
step fingerprint mode=fingerprint "device=$devices" "dtype=$dtypes" "${steps[@]}"  # one mode a step: run.py's
step stats mode=stats "device=$devices" "dtype=$dtypes" "${steps[@]}"              # preflight checks knobs per mode
step benchmark mode=benchmark "device=$devices" "backend=$backends" "mode.backends=[$backends,onnxruntime]" \
    "mode.batch_sizes=$ladder" batch_size=64 "$scenarios" "${bench[@]}"
fixtures=()
for f in "$shared/pyramids/Pyramids/Pyramids-1000021.pt" "$shared/huggy_lstm/Huggy/Huggy-2000049.pt"; do
    [ -f "$f" ] && fixtures+=("$f")
done
if [ ${#fixtures[@]} -gt 0 ]; then
    list="$(IFS=,; echo "${fixtures[*]}")"
    step fixtures-precision mode=precision "device=$devices" "dtype=$dtypes" "model.checkpoint=$list" obs.rows=64
    step fixtures-benchmark mode=benchmark "device=$devices" "model.checkpoint=$list" "mode.batch_sizes=[1,64]" \
        "mode.scenarios=[single_stream,offline,server,control_loop]" "${bench[@]}"
else
    echo -e "\n## fixtures: not run (no ML-Agents fixtures under $shared)" >> "$report"
fi
echo "summary: $report (exit $status)"
exit "$status"
