#!/bin/bash
# Records sample_traces/h200_hf/: hf_workloads.py's workloads on one H200 (kind nvidia-h200), each with its
# truth, and packs them into OUTDIR/h200_hf.tar.gz.
#   bash sample_traces/generate/record_hf.sh OUTDIR [workloads...]
# Needs libdw.so.1 + libelf.so.1 in <repo>/.device_libs (for nsys's QdstrmImporter, see README.md).
set -u
OUTDIR=${1:?usage: record_hf.sh OUTDIR [workloads...]}
shift
WORKLOADS=${*:-llama_eager llama_nsys fp8_gemm llama_compile llama_fsdp2 llama_generate input_bound llama_memory memory_pressure cuda_graph}
G=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$G/../.." && pwd)
LIBS=$ROOT/.device_libs
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
W=/tmp/rec
mkdir -p "$W/h200_hf" "$OUTDIR"
source "$G/nsys_lib.sh"
cd "$G"
{
  echo "date_u=$(date -u)"; uname -a; nproc; nvidia-smi
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,clocks.max.sm --format=csv
  "$NSYS" --version
  python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'transformers', transformers.__version__)"
} > "$W/machine_info.txt" 2>&1
cat "$W/machine_info.txt"
O=$W/h200_hf
for w in $WORKLOADS; do
  case $w in
    llama_nsys)
      # GPU metrics at 10 kHz inside the capture range only (a few hundred ms)
      NSYS_CAPTURE=1 NSYS_EXTRA="--gpu-metrics-devices=all --gpu-metrics-frequency=10000" \
        step "$w" nsys_clean "$O/llama_nsys" python3 hf_workloads.py --workload llama_nsys --out "$O"
      rm -f "$O"/llama_nsys.stats* ;;
    *) step "$w" timeout -k 10 240 python3 hf_workloads.py --workload "$w" --out "$O" ;;
  esac
  echo "[$SECONDS s]"; ls -la "$O"
  [ $SECONDS -gt 480 ] && { echo "stopping: $SECONDS s used"; break; }
done
tar -C "$W" -czf "$OUTDIR/h200_hf.tar.gz" h200_hf machine_info.txt
ls -la "$OUTDIR"
echo "total $SECONDS s"
