#!/bin/bash
# Records sample_traces/h200_nsys_memory/: hf_workloads.py's nsys_memory program under
# `nsys profile --cuda-memory-usage=true` (whole process, CUDA + NVTX, no CPU sampling, no GPU metrics) on one
# H200 (kind nvidia-h200), once per allocator setting, each with its truth, packed into OUTDIR/h200_nsys_memory.tar.gz.
#   bash sample_traces/generate/record_nsys_memory.sh OUTDIR [LIBS]
#     nsys_memory          native caching allocator, --fill 0.92 (PR701 fires)
#     nsys_memory_async    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, --fill 0 (stream-ordered pool)
#     nsys_memory_expand   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, --fill 0 (cuMemCreate / cuMemMap)
# LIBS: the folder with libdw.so.1 + libelf.so.1 for nsys's QdstrmImporter (default <repo>/.device_libs).
set -u
OUTDIR=${1:?usage: record_nsys_memory.sh OUTDIR [LIBS]}
G=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$G/../.." && pwd)
LIBS=$(cd "${2:-$ROOT/.device_libs}" && pwd)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID
W=/tmp/rec
O=$W/h200_nsys_memory
mkdir -p "$O" "$OUTDIR"
source "$G/nsys_lib.sh"
{
  echo "date_u=$(date -u)"; uname -a; nproc; nvidia-smi
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,memory.total --format=csv
  "$NSYS" --version
  python3 -c "import sys, torch; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} > "$O/machine_info.txt" 2>&1
cat "$O/machine_info.txt"
NSYS_EXTRA="--cuda-memory-usage=true"
for spec in "nsys_memory|0.92|" "nsys_memory_async|0|backend:cudaMallocAsync" "nsys_memory_expand|0|expandable_segments:True"; do
  IFS='|' read -r name fill conf <<< "$spec"
  step "$name" nsys_clean "$O/$name" env ${conf:+PYTORCH_CUDA_ALLOC_CONF=$conf} python3 hf_workloads.py \
    --workload nsys_memory --name "$name" --fill "$fill" --out "$O"
  rm -f "$O/$name".stats*
  ls -la "$O"
  [ $SECONDS -gt 240 ] && { echo "stopping: $SECONDS s used"; break; }
done
tar -C "$W" -czf "$OUTDIR/h200_nsys_memory.tar.gz" h200_nsys_memory
ls -la "$OUTDIR"
echo "total $SECONDS s"
