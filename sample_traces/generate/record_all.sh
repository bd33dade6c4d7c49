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
W=/tmp/rec
mkdir -p "$W/single" "$W/ddp" "$W/bench" "$OUTDIR"
source "$G/nsys_lib.sh"

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
      NSYS_CAPTURE=1 step single_nsys nsys_clean "$W/single/nsys_single" python3 single_gpu.py --mode nsys --out "$W/single"
      if [ "$(stat -c %s "$W/single/nsys_single.sqlite" 2>/dev/null || echo 0)" -gt 4500000 ]; then
        echo "sqlite > 4.5 MB: re-recording nsys with a smaller launch_bound / train_step"
        NSYS_CAPTURE=1 step single_nsys_small nsys_clean "$W/single/nsys_single" python3 single_gpu.py --mode nsys \
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
