#!/usr/bin/env bash
# Data parallel on this machine: for the wide MLP (configs/mlp-fp32.toml) and the tiny GPT
# (configs/gpt-tiny-fp32.toml), one process on 2 threads against 2 ranks on 1 thread each
# (mpirun): the all-reduce overlapped with backward by the mpi communicator's thread (the default)
# or by testing its requests between ops, not overlapped, and with the optimizer state sharded
# (ZeRO stage 1); and, as the bound, two processes on half the batch each that never communicate. Prints the CPU and a table: samples/s and the ratio to one
# process, the time blocked in all-reduce per step, the share of buckets started during backward,
# how much of the communication backward hid (1 - blocked overlapped / blocked not overlapped),
# and the optimizer-state and peak device bytes per rank (the largest rank's, as summary.json
# records them).
#
#   bash bench/distributed/run.sh [BUILD_DIR] [WORK_DIR]
#
# Environment: MLP_STEPS (default 30), GPT_STEPS (default 60). Takes about 5 minutes on an idle
# 2-core machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(realpath "${1:-$root/build}")
work=${2:-$(mktemp -d /tmp/mixtrain-dp.XXXXXX)}
mixtrain=$build/bin/mixtrain
MLP_STEPS=${MLP_STEPS:-30}
GPT_STEPS=${GPT_STEPS:-60}
command -v mpirun >/dev/null || { echo "run.sh: mpirun not found (apt install openmpi-bin)" >&2; exit 2; }
mkdir -p "$work"
echo "# $(date -u +%FT%TZ)  $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $(mpirun --version | head -1)"
echo "# work folder: $work"
mpi=(mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 -np 2)
run() {  # NAME CONFIG STEPS [mpi] ARGS...
  local name=$1 config=$2 steps=$3
  shift 3
  local launcher=()
  if [[ ${1:-} == mpi ]]; then launcher=("${mpi[@]}"); shift; fi
  echo "+ ${launcher[*]} mixtrain train $(basename "$config") --set run.steps=$steps $*" >&2
  OMP_NUM_THREADS=${OMP_THREADS:-2} "${launcher[@]}" "$mixtrain" train "$config" \
    --set run.steps="$steps" --set run.log_every=1000 --set run.eval_every=0 \
    --set checkpoint.every=0 --log-level warn "$@" --run-dir "$work/$name" >/dev/null
}
for model in mlp gpt; do
  if [[ $model == mlp ]]; then config=$root/configs/mlp-fp32.toml steps=$MLP_STEPS
  else config=$root/configs/gpt-tiny-fp32.toml steps=$GPT_STEPS; fi
  run "$model-1x2" "$config" "$steps" --set backend.cpu.threads=2
  OMP_THREADS=1 run "$model-2x1" "$config" "$steps" mpi --set backend.cpu.threads=1 \
    --set distributed.type=mpi
  OMP_THREADS=1 run "$model-2x1-serial" "$config" "$steps" mpi --set backend.cpu.threads=1 \
    --set distributed.type=mpi --set distributed.overlap=false
  OMP_THREADS=1 run "$model-2x1-test" "$config" "$steps" mpi --set backend.cpu.threads=1 \
    --set distributed.type=mpi --set distributed.mpi.progress=test
  OMP_THREADS=1 run "$model-2x1-zero1" "$config" "$steps" mpi --set backend.cpu.threads=1 \
    --set distributed.type=mpi --set distributed.shard_optimizer=true
  # What 2 ranks could do without communicating: two independent processes on half the batch each,
  # side by side (their samples/s add up).
  half=$(( $(sed -n 's/^batch_size = //p' "$config") / 2 ))
  OMP_THREADS=1 run "$model-alone-a" "$config" "$steps" --set backend.cpu.threads=1 \
    --set data.batch_size=$half &
  OMP_THREADS=1 run "$model-alone-b" "$config" "$steps" --set backend.cpu.threads=1 \
    --set data.batch_size=$half
  wait
done
/usr/bin/python3 - "$work" <<'PY'
import json, sys, pathlib
work = pathlib.Path(sys.argv[1])
def s(name): return json.loads((work / name / "summary.json").read_text())
print("| model | run | samples/s | vs 1×2 | blocked in all-reduce ms/step | buckets started in backward | hidden by backward | optimizer state MiB/rank | peak device MiB/rank |")
print("|---|---|---|---|---|---|---|---|---|")
for model in ("mlp", "gpt"):
    base = s(f"{model}-1x2")
    serial = s(f"{model}-2x1-serial")["distributed"]
    for run, label in (("1x2", "1 rank × 2 threads"),
                       ("2x1", "2 ranks × 1 thread, overlapped (communication thread)"),
                       ("2x1-test", "2 ranks × 1 thread, overlapped (requests tested between ops)"),
                       ("2x1-serial", "2 ranks × 1 thread, after backward"),
                       ("2x1-zero1", "2 ranks × 1 thread, ZeRO-1")):
        r = s(f"{model}-{run}")
        d = r.get("distributed")
        steps = r["steps"]
        if d:
            blocked = 1e3 * d["allreduce_wait_seconds"] / steps
            started = f'{d["buckets_started_in_backward"]}/{d["buckets_communicated"]}'
            hidden = "" if run == "2x1-serial" or serial["allreduce_wait_seconds"] == 0 else \
                f'{100 * (1 - d["allreduce_wait_seconds"] / serial["allreduce_wait_seconds"]):.0f}%'
            state = d["optimizer_state_bytes_per_rank"] / 2**20
            peak = d["peak_memory_bytes_per_rank"] / 2**20
        else:
            blocked, started, hidden = 0.0, "", ""
            peak = r["peak_memory_bytes"] / 2**20
            state = None
        ratio = r["samples_per_s"] / base["samples_per_s"]
        print(f'| {model} | {label} | {r["samples_per_s"]:.0f} | {ratio:.2f}× | '
              f'{blocked:.1f} | {started} | {hidden} | '
              f'{"" if state is None else f"{state:.1f}"} | {peak:.1f} |')
    alone = s(f"{model}-alone-a")["samples_per_s"] + s(f"{model}-alone-b")["samples_per_s"]
    print(f'| {model} | 2 processes × 1 thread, half batch each, not communicating (the bound) | '
          f'{alone:.0f} | {alone / base["samples_per_s"]:.2f}× |  |  |  |  |  |')
PY
