#!/bin/bash
# Records every sample trace of sample_traces/ on one 2-GPU H200 machine (kind nvidia-h200-x2).
#   bash sample_traces/generate/record_all.sh OUTDIR [steps...]
# steps (default all): none kineto nsys ddp ddpnsys bench
# Needs libdw.so.1 + libelf.so.1 in <repo>/.device_libs (for nsys's QdstrmImporter, see README.md).
# Writes OUTDIR/single.tar.gz, OUTDIR/ddp.tar.gz, OUTDIR/kineto_bench_big.pt.trace.json.gz (split in
# 15 MB parts if larger than 16 MB).
set -u
OUTDIR=${1:?usage: record_all.sh OUTDIR [steps...]}
shift
STEPS=${*:-none kineto nsys ddp ddpnsys bench}
G=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$G/../.." && pwd)
LIBS=$ROOT/.device_libs
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID
H=/opt/nvidia/nsight-compute/2025.3.1/host
NSYS=$H/target-linux-x64/nsys
QI=$H/linux-desktop-glibc_2_11_3-x64/QdstrmImporter
W=/tmp/rec
mkdir -p "$W/single" "$W/ddp" "$W/bench" "$OUTDIR"
# nsys stores environments in the report: give it a minimal one (and see nsys_clean below)
CLEAN=(env -i "PATH=$PATH" "HOME=${HOME:-/root}" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
       TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_ORDER=PCI_BUS_ID)
[ -n "${LD_LIBRARY_PATH:-}" ] && CLEAN+=("LD_LIBRARY_PATH=$LD_LIBRARY_PATH")
[ -n "${TZ+x}" ] && CLEAN+=("TZ=$TZ")
NSYS_OPTS=(profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --force-overwrite=true)

step() {
  local name=$1; shift; local t0=$SECONDS
  echo "=== [$SECONDS s] $name: $*"
  "$@"; local rc=$?
  echo "=== [$SECONDS s] $name rc=$rc ($((SECONDS - t0)) s)"
  return $rc
}
finish_nsys() {  # $1 = report base path: .qdstrm -> .nsys-rep -> .sqlite (+ nsys stats csv)
  local b=$1
  [ -f "$b.nsys-rep" ] || env LD_LIBRARY_PATH="$LIBS:$H/linux-desktop-glibc_2_11_3-x64" "$QI" -i "$b.qdstrm"
  [ -f "$b.nsys-rep" ] && rm -f "$b.qdstrm"
  "$NSYS" export --type sqlite --force-overwrite=true -o "$b.sqlite" "$b.nsys-rep"
  "$NSYS" stats --force-export=false --report nvtx_sum,cuda_gpu_kern_sum --format csv -o "$b.stats" "$b.nsys-rep" >/dev/null 2>&1
  ls -la "$b".*
}
env_leak() {  # foreign environment blocks (other processes' /proc/PID/environ) in an nsys export?
  python3 - "$1" <<'PYEOF'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
vals = [v for (v,) in c.execute("select value from StringIds") if isinstance(v, str) and "\x00" in v and "=" in v]
# names that only the machine's own processes (image / shell environment) carry, never env -i's
sentinels = ("CONTAINER_NAME=", "OLDPWD=", "TERM=", "UV_", "NV_CUDA_", "PIP_", "SSL_CERT_FILE=", "SHLVL=")
foreign = [v for v in vals if any(p.startswith(sentinels) for p in v.split("\x00"))]
print("env blocks: %d, with variables not set by us: %d" % (len(vals), len(foreign)))
for v in foreign:
    print("   foreign names:", sorted({p.split("=")[0] for p in v.split("\x00") if "=" in p})[:12], "...")
sys.exit(1 if foreign else 0)
PYEOF
}
nsys_clean() {  # $1 = report base; rest = command.
  # nsys stores the environment block of every process it can read (/proc/PID/environ), the machine's
  # own shells included. Run it in its own PID namespace (unshare; only our processes are visible, each
  # with env -i's minimal environment); if that fails or still leaks, as user nobody (cannot read
  # root's /proc/PID/environ).
  local b=$1; shift
  local wrap wr hm
  mkdir -p /tmp/gen /tmp/nbhome && cp "$G"/*.py /tmp/gen/ && chmod -R a+rwX "$W" /tmp/gen /tmp/nbhome
  for wrap in unshare nobody; do
    rm -f "$b".*
    if [ $wrap = unshare ]; then wr=(unshare --pid --fork --kill-child --mount-proc); hm=(HOME=/root)
    else wr=(setpriv --reuid=65534 --regid=65534 --clear-groups); hm=(HOME=/tmp/nbhome); fi
    (cd /tmp/gen && timeout -k 10 200 "${wr[@]}" "${CLEAN[@]}" "${hm[@]}" "$NSYS" "${NSYS_OPTS[@]}" \
       $( [[ "$b" == *single* ]] && echo "--capture-range=cudaProfilerApi --capture-range-end=stop" ) \
       -o "$b" "$@")
    finish_nsys "$b" && env_leak "$b.sqlite" && { echo "nsys report without foreign environments ($wrap)"; return 0; }
    echo "nsys via $wrap: failed or foreign environments in the report"
  done
  return 1
}
ship() {  # split a file for the 16 MB transfer limit
  local f=$1
  if [ "$(stat -c %s "$f")" -gt 16000000 ]; then split -b 15000000 -d "$f" "$f.part"; rm -f "$f"; fi
}
pack() {  # $1 = name under $W
  tar -C "$W" -czf "$OUTDIR/$1.tar.gz" "$1" machine_info.txt && ship "$OUTDIR/$1.tar.gz"
}

cd "$G"
{
  echo "date_u_epoch=$(date -u +%s.%N)"; echo "date_local=$(date)"; echo "date_u=$(date -u)"
  echo "TZ=${TZ-unset}"; echo "tz_offset=$(date +'%z %Z')"; uname -a; nproc
  nvidia-smi; nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,uuid,clocks.max.sm --format=csv
  nvidia-smi topo -m
  "$NSYS" --version
  python3 -c "import sys, torch; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(), 'nccl', torch.cuda.nccl.version(), 'cudnn', torch.backends.cudnn.version())"
  python3 -c "import pynvml; pynvml.nvmlInit(); print('nvml driver', pynvml.nvmlSystemGetDriverVersion())"
} > "$W/machine_info.txt" 2>&1
cat "$W/machine_info.txt"

for s in $STEPS; do
  case $s in
    none)   step single_none timeout -k 10 150 python3 single_gpu.py --mode none --out "$W/single" ;;
    kineto) step single_kineto timeout -k 10 180 python3 single_gpu.py --mode kineto --out "$W/single" ;;
    nsys)
      step single_nsys nsys_clean "$W/single/nsys_single" python3 single_gpu.py --mode nsys --out "$W/single"
      if [ "$(stat -c %s "$W/single/nsys_single.sqlite" 2>/dev/null || echo 0)" -gt 4500000 ]; then
        echo "sqlite > 4.5 MB: re-recording nsys with a smaller launch_bound / train_step"
        step single_nsys_small nsys_clean "$W/single/nsys_single" python3 single_gpu.py --mode nsys \
          --out "$W/single" --launch-iters 300 --train-steps 2
      fi
      ;;
    ddp)
      step ddp_kineto timeout -k 10 180 python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
        ddp_late_rank.py --mode kineto --out "$W/ddp" ;;
    ddpnsys)
      step ddp_nsys nsys_clean "$W/ddp/nsys_ddp" python3 -m torch.distributed.run --standalone \
        --nproc_per_node 2 ddp_late_rank.py --mode nsys --out "$W/ddp"
      ;;
    bench)
      if [ $SECONDS -lt 330 ]; then
        step bench timeout -k 10 180 python3 single_gpu.py --mode bench --out "$W/bench"
        for f in "$W"/bench/*.gz; do mv "$f" "$OUTDIR/" && ship "$OUTDIR/$(basename "$f")"; done
      else
        echo "skipping bench: $SECONDS s used"
      fi ;;
  esac
  case $s in none|kineto|nsys) pack single ;; ddp|ddpnsys) pack ddp ;; esac
done
ls -la "$W"/single "$W"/ddp "$OUTDIR"
echo "total $SECONDS s"
