#!/bin/bash
# One torchrun worker under its own `nsys profile` (torchrun --no-python bash rank_nsys.sh): as users profile
# one report per rank. Its own PID namespace and `env -i` with only the job's variables, so the report stores no
# other process's environment; its own TMPDIR so two nsys sessions do not share stream files.
set -u
mapfile -t kv < <(env | grep -E '^(PATH|HOME|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_RANK|ROLE_NAME|ROLE_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_[A-Z_]*|TORCH_NCCL_[A-Z_]*|OMP_NUM_THREADS|PYTHONUNBUFFERED|NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS|CUDA_DEVICE_ORDER)=')
mkdir -p "/tmp/nsys-rank$RANK"
exec $WRAP env -i "${kv[@]}" "TMPDIR=/tmp/nsys-rank$RANK" "$NSYS" profile --trace=cuda,nvtx --sample=none \
  --cpuctxsw=none --force-overwrite=true -o "$REC/gloo_rank$RANK" python3 "$JOB"
