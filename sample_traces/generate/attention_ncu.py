#!/usr/bin/env python3
"""Attention sample for plasmient-report: torch SDPA (flash backend, bf16) under the PyTorch profiler AND under
Nsight Compute, so that the attention FLOP model can be checked against the hardware's tensor-op counts.

Cases (each inside record_function / NVTX range ``case:<name>``; forward then backward of one SDPA call):

  full      B=4 H=16  L=S=2048 D=128, non-causal
  causal    B=4 H=16  L=S=2048 D=128, is_causal=True
  gqa       B=4 Hq=32 Hkv=8 L=S=2048 D=128, non-causal, enable_gqa=True (if this torch supports it)
  cross     B=4 H=16  L=1024 S=2048 D=64, non-causal (query and key lengths differ)
  cudnn     the `full` shapes on the cuDNN backend (torch's default on Hopper), if it runs

Modes:
  --mode kineto   warm up, then profile ONE pass of all cases (record_shapes) -> attention.pt.trace.json.gz
  --mode ncu      ONE pass of all cases, no warm-up, to be run under ncu (same kernels in the same order)
  --mode record   both of the above: runs itself under the profiler, then under
                  `ncu --csv --page raw --metrics ... --kernel-name regex:flash|fmha|sdpa|attention` -> ncu_raw.csv,
                  and writes run_info.json (cases, versions, which metrics this ncu/GPU had, kernel list)
"""

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time

CASES = [
    # name, B, Hq, Hkv, L, S, D, causal, backend
    ("full", 4, 16, 16, 2048, 2048, 128, False, "flash"),
    ("causal", 4, 16, 16, 2048, 2048, 128, True, "flash"),
    ("gqa", 4, 32, 8, 2048, 2048, 128, False, "flash"),
    ("cross", 4, 16, 16, 1024, 2048, 64, False, "flash"),
    ("cudnn", 4, 16, 16, 2048, 2048, 128, False, "cudnn"),
]
# FLOP-counting metrics (NERSC roofline method + tensor-op counts); only those this ncu knows are asked for.
METRIC_CANDIDATES = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "sm__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hfma_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_hadd_pred_on.sum",
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "sm__ops_path_tensor_src_fp16_dst_fp32.sum",
    "sm__ops_path_tensor_src_fp16_dst_fp16.sum",
    "sm__inst_executed_pipe_tensor.sum",
    "sm__inst_executed_pipe_tensor_op_hmma.sum",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "sm__inst_executed_pipe_xu.sum",
    "smsp__inst_executed_op_mufu.sum",
]
KERNEL_RE = "regex:flash|fmha|sdpa|attention"


def run_cases():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    dev = "cuda"
    done = {}

    def one(name, b, hq, hkv, lq, s, d, causal, backend):
        q = torch.randn(b, hq, lq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, hkv, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, hkv, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(b, hq, lq, d, device=dev, dtype=torch.bfloat16)
        torch.cuda.synchronize()
        be = SDPBackend.FLASH_ATTENTION if backend == "flash" else SDPBackend.CUDNN_ATTENTION
        kw = {"enable_gqa": True} if hq != hkv else {}
        with sdpa_kernel([be]), torch.autograd.profiler.record_function(f"case:{name}"):
            torch.cuda.nvtx.range_push(f"case:{name}")
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)
            out.backward(g)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()

    for c in CASES:
        try:
            one(*c)
            done[c[0]] = "ok"
        except Exception as e:  # a backend / option this torch lacks: recorded, the other cases go on
            done[c[0]] = f"skipped: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            torch.cuda.synchronize()
    return done


def mode_kineto(out):
    import torch
    from torch.profiler import ProfilerActivity, profile

    run_cases()  # warm-up: cuDNN plans, allocator, lazy module loading
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        done = run_cases()
    raw = os.path.join(out, "attention.pt.trace.json")
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    os.remove(raw)
    with open(os.path.join(out, "kineto_cases.json"), "w") as f:
        json.dump(done, f, indent=1)
    print("kineto cases:", done, flush=True)


def find_ncu():
    p = shutil.which("ncu")
    if p:
        return p
    for d in (
        sorted(os.listdir("/opt/nvidia/nsight-compute"), reverse=True) if os.path.isdir("/opt/nvidia/nsight-compute") else []
    ):
        c = os.path.join("/opt/nvidia/nsight-compute", d, "ncu")
        if os.path.exists(c):
            return c
    return None


def mode_record(out):
    import torch

    os.makedirs(out, exist_ok=True)
    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(0),
        "python": sys.version.split()[0],
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "cases": [dict(zip(("name", "B", "Hq", "Hkv", "L", "S", "D", "causal", "backend"), c, strict=True)) for c in CASES],
    }
    me = os.path.abspath(__file__)
    t0 = time.time()
    r = subprocess.run([sys.executable, me, "--mode", "kineto", "--out", out])
    info["kineto_rc"], info["kineto_s"] = r.returncode, round(time.time() - t0, 1)
    ncu = find_ncu()
    info["ncu_path"] = ncu
    if ncu:
        info["ncu_version"] = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip()
        q = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True)
        known = set(re.findall(r"^(\S+)", q.stdout, re.M))
        metrics = [m for m in METRIC_CANDIDATES if m.rsplit(".", 1)[0] in known]
        if len(metrics) < 4:  # the query failed or lists differently: the metrics seen in an H200 ncu CSV before
            metrics = [m for m in METRIC_CANDIDATES if "pipe_tensor_op" not in m and "mufu" not in m]
        info["metrics_asked"], info["metrics_unknown"] = metrics, [m for m in METRIC_CANDIDATES if m not in metrics]
        cmd = [
            ncu,
            "--csv",
            "--page",
            "raw",
            "--clock-control",
            "none",
            "--kernel-name",
            KERNEL_RE,
            "--metrics",
            ",".join(metrics),
            sys.executable,
            me,
            "--mode",
            "ncu",
            "--out",
            out,
        ]
        info["ncu_cmd"] = " ".join(cmd)
        t0 = time.time()
        with open(os.path.join(out, "ncu_raw.csv"), "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True)
        info["ncu_rc"], info["ncu_s"], info["ncu_stderr_tail"] = r.returncode, round(time.time() - t0, 1), r.stderr[-2000:]
    with open(os.path.join(out, "run_info.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps({k: v for k, v in info.items() if k != "cases"}, indent=1), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("kineto", "ncu", "record"), default="record")
    ap.add_argument("--out", default="attention_out")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.mode == "kineto":
        mode_kineto(a.out)
    elif a.mode == "ncu":
        print("ncu cases:", run_cases(), file=sys.stderr, flush=True)
    else:
        mode_record(a.out)


if __name__ == "__main__":
    main()
