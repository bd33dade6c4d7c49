#!/usr/bin/env python3
"""Single-GPU sample-trace generator for plasmient-report.

Runs five phases on one GPU, each inside a range named ``phase:<name>``:

  phase:compute_bound  N x bf16 torch.mm 8192^3                 (tensor-core bound)
  phase:memory_bound   N x x.mul_(1.0001).add_(1e-6), 1 GiB fp32 (HBM bound)
  phase:launch_bound   N x tiny.add_(1.0) on a 1-element tensor  (launch-latency bound)
  phase:host_stall     N x (1024^3 bf16 mm, .item() sync, 20 ms sleep)
  phase:train_step     N training steps of a small GPT (bf16 autocast, SDPA, fused AdamW)

Modes:
  --mode none    unprofiled: measure ground truth (phase times, mm TFLOP/s, HBM GB/s),
                 write ground_truth.json
  --mode kineto  torch.profiler (CPU+CUDA, record_shapes, with_flops) -> kineto_single.pt.trace.json.gz
                 plus NVML / nvidia-smi logs and host_clock.txt
  --mode nsys    run under `nsys profile --capture-range=cudaProfilerApi`; NVTX ranges via
                 torch.cuda.nvtx + torch.autograd.profiler.emit_nvtx(record_shapes=True)
  --mode bench   a big Kineto trace (train_step repeated until ~--bench-mb MB of JSON), for benchmarks

Everything (cuBLAS handles, allocator, autocast caches, optimizer state) is warmed up before the
profiled region.  Each phase is preceded by torch.cuda.synchronize() + ~0.2 s of idle and ends with
torch.cuda.synchronize() INSIDE its range, so the CPU-side range covers all of its GPU work.
"""

import argparse
import contextlib
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# The compute / memory / launch phases and the NVML sampler are plasmient-report's own (`plasmient-report measure`
# runs the same workloads): found in the repository two folders up, or in a copy beside this script (nsys_lib.sh).
_HERE = os.path.dirname(os.path.abspath(__file__))
for _root in (os.path.dirname(os.path.dirname(_HERE)), _HERE):
    if os.path.isdir(os.path.join(_root, "plasmient_report", "workloads")):
        sys.path.insert(0, _root)
        break
from plasmient_report.workloads.kernels import Launch, Matmul, Memory  # noqa: E402
from plasmient_report.workloads.nvml import NvmlSampler  # noqa: E402

DEVICE = os.environ.get("GEN_DEVICE", "cuda")  # "cpu" only for a smoke test of the code paths
H200_BF16_DENSE_PEAK = 989.4e12  # FLOP/s, datasheet, dense bf16 (SXM)
H200_HBM_PEAK = 4.8e12  # B/s, datasheet


# ----------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d, bias=False)
        self.fc2 = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        h = self.n_head
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, h, C // h).transpose(1, 2)
        k = k.view(B, T, h, C // h).transpose(1, 2)
        v = v.view(B, T, h, C // h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x


class GPT(nn.Module):
    def __init__(self, vocab, seq, d, n_layer, n_head):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)  # not tied to self.tok

    def forward(self, idx):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def gpt_flops(B, T, d, L, V):
    """Analytic FLOPs of one training step (fwd + bwd), our convention:
    matmul: 6 * tokens * P_matmul, P_matmul = L*12*d^2 (qkv 3d^2, proj d^2, fc1 4d^2, fc2 4d^2) + d*V (lm head);
            embeddings, LayerNorm, GELU, softmax, loss and the optimizer are not counted.
    attention: QK^T and AV, 2*B*T^2*d each forward -> 4*B*T^2*d per layer forward, x3 for fwd+bwd
            = 12*B*T^2*d*L, counted NON-causal (full T^2); a causal flash kernel does about half.
    """
    tokens = B * T
    p_matmul = L * 12 * d * d + d * V
    mm = 6 * tokens * p_matmul
    attn = 12 * B * T * T * d * L
    return {
        "tokens": tokens,
        "params_matmul": p_matmul,
        "matmul_flops": mm,
        "attention_flops_noncausal": attn,
        "attention_flops_causal_half": attn // 2,
        "total_flops": mm + attn,
    }


# ----------------------------------------------------------------------------- loggers
class SmiLoggers:
    def __init__(self, outdir, nvml_index, prefix=""):
        self.files = []
        self.procs = []
        q = "timestamp,index,uuid,name,pci.bus_id,utilization.gpu,utilization.memory,clocks.sm,power.draw"
        cmds = [
            (["nvidia-smi", "dmon", "-s", "pucm", "-o", "DT", "-i", str(nvml_index)], prefix + "nvidia_smi_dmon.txt"),
            (
                ["nvidia-smi", "--query-gpu=" + q, "--format=csv", "-lms", "100", "-i", str(nvml_index)],
                prefix + "nvidia_smi_query.csv",
            ),
        ]
        for cmd, name in cmds:
            f = open(os.path.join(outdir, name), "w")
            self.files.append(f)
            self.procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT))

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in self.files:
            f.close()


def clock_snapshot(label):
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception as e:
            return "ERR %s" % e

    return (
        "\n".join(
            [
                "[%s]" % label,
                "date_u_epoch=%s" % sh(["date", "-u", "+%s.%N"]),
                "date_local=%s" % sh(["date"]),
                "date_u=%s" % sh(["date", "-u"]),
                "date_tz_offset=%s" % sh(["date", "+%z %Z"]),
                "python_time_ns=%d" % time.time_ns(),
                "python_monotonic_ns=%d" % time.monotonic_ns(),
                "python_perf_counter_ns=%d" % time.perf_counter_ns(),
            ]
        )
        + "\n"
    )


def nvml_index_for_cuda0():
    """NVML index of the GPU that CUDA calls device 0 (matched by UUID, else 0)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        return int(pynvml.nvmlDeviceGetIndex(h)), uuid
    except Exception as e:
        print("could not match CUDA device 0 to NVML by uuid (%s); using index 0" % e)
        return 0, None


def sh_out(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:
        return "ERR %s" % e


# ----------------------------------------------------------------------------- workload
class Workload:
    def __init__(self, a):
        self.a = a
        dev = DEVICE
        g = torch.Generator(device=dev)
        g.manual_seed(0)
        self.mm = Matmul(dev, a.mm_n, generator=g)  # A, B drawn from g first, as before
        self.mem = Memory(dev, a.mem_bytes)
        self.launch = Launch(dev)
        self.A, self.Bm, self.x, self.tiny = self.mm.A, self.mm.B, self.mem.x, self.launch.tiny
        s = a.stall_n
        self.S1 = torch.randn(s, s, device=dev, dtype=torch.bfloat16, generator=g)
        self.S2 = torch.randn(s, s, device=dev, dtype=torch.bfloat16, generator=g)
        self.model = GPT(a.vocab, a.seq, a.d_model, a.n_layer, a.n_head).to(dev)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.idx = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev, generator=g)
        self.tgt = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev, generator=g)
        self.mark = contextlib.nullcontext  # replaced per mode: mark(name) -> context manager

    # phases ------------------------------------------------------------------
    def compute_bound(self):
        self.mm.run(self.a.compute_iters)

    def memory_bound(self):
        self.mem.run(self.a.mem_iters)

    def launch_bound(self):
        self.launch.run(self.a.launch_iters)

    def host_stall(self):
        for _ in range(self.a.stall_iters):
            c = torch.mm(self.S1, self.S2)
            c[0, 0].item()
            time.sleep(self.a.stall_sleep)

    def one_train_step(self):
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model(self.idx)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), self.tgt.view(-1))
        loss.backward()
        self.opt.step()

    def train_step(self, steps=None):
        for _ in range(self.a.train_steps if steps is None else steps):
            with self.mark("train_step"):
                self.one_train_step()

    def phases(self):
        return [
            ("compute_bound", self.compute_bound),
            ("memory_bound", self.memory_bound),
            ("launch_bound", self.launch_bound),
            ("host_stall", self.host_stall),
            ("train_step", self.train_step),
        ]


def run_phases(w, idle, record=None):
    """Runs the five phases with markers; returns per-phase wall-clock windows (epoch ns)."""
    windows = []
    for name, fn in w.phases():
        torch.cuda.synchronize()
        time.sleep(idle)
        t0 = time.time_ns()
        with w.mark("phase:" + name):
            fn()
            torch.cuda.synchronize()
        t1 = time.time_ns()
        windows.append({"phase": "phase:" + name, "wall_start_ns": t0, "wall_end_ns": t1, "wall_ms": (t1 - t0) / 1e6})
    torch.cuda.synchronize()
    time.sleep(idle)
    return windows


def warm_up(w):
    print("warm-up ...", flush=True)
    for _ in range(3):
        torch.mm(w.A, w.Bm)
    for _name, fn in w.phases():
        fn()
    w.train_step(steps=2)  # optimizer state exists after the first; a few more for caches
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------- ground truth
def time_gpu(fn, reps):
    """Median over reps of (cuda-event span, wall span) of fn(); GPU idle at start of each rep."""
    gpu, wall = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        gpu.append(s.elapsed_time(e))
    return statistics.median(gpu), statistics.median(wall), gpu, wall


def ground_truth(w, a, outdir):
    print("ground truth ...", flush=True)
    gt = {"recorded_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    props = torch.cuda.get_device_properties(0)
    gt["env"] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": sys.version.split()[0],
        "gpu_name": torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count,
        "gpu_mem_bytes": props.total_memory,
        "nvidia_smi": sh_out(
            ["nvidia-smi", "--query-gpu=index,name,driver_version,pci.bus_id,uuid", "--format=csv,noheader"]
        ).splitlines(),
        "nvidia_smi_cuda_version": [ln for ln in sh_out(["nvidia-smi"]).splitlines() if "CUDA Version" in ln],
    }
    # --- peak-ish ceilings measured on this machine (unprofiled)
    n = a.mm_n
    mm_ms, _, mm_all, _ = time_gpu(lambda: torch.mm(w.A, w.Bm), 20)
    mm_mean = sum(mm_all) / len(mm_all)
    gt["measured_mm"] = {
        "shape": [n, n, n],
        "dtype": "bf16",
        "reps": 20,
        "median_ms": mm_ms,
        "mean_ms": mm_mean,
        "tflops_median": 2 * n**3 / (mm_ms * 1e-3) / 1e12,
        "tflops_mean": 2 * n**3 / (mm_mean * 1e-3) / 1e12,
    }
    nel = w.x.numel()
    bw_ms, _, bw_all, _ = time_gpu(lambda: w.x.mul_(1.0001), 20)
    gt["measured_hbm"] = {
        "op": "x.mul_(1.0001) in place, fp32",
        "bytes_per_op": 2 * nel * 4,
        "reps": 20,
        "median_ms": bw_ms,
        "tb_per_s": 2 * nel * 4 / (bw_ms * 1e-3) / 1e12,
    }
    # --- analytic FLOPs per phase
    gptf = gpt_flops(a.batch, a.seq, a.d_model, a.n_layer, a.vocab)
    flops = {
        "compute_bound": a.compute_iters * 2 * n**3,
        "memory_bound": a.mem_iters * 2 * nel,  # fp32 elementwise (CUDA cores), 1 mul + 1 add per element
        "launch_bound": a.launch_iters * 1,
        "host_stall": a.stall_iters * 2 * a.stall_n**3,
        "train_step": a.train_steps * gptf["total_flops"],
    }
    tensor_core = {"compute_bound": True, "memory_bound": False, "launch_bound": False, "host_stall": True, "train_step": True}
    bytes_moved = {"memory_bound": a.mem_iters * 2 * (2 * nel * 4)}
    # --- unprofiled phase timings (same code and markers-off as the profiled run)
    phases = {}
    for name, fn in w.phases():
        time.sleep(a.idle)
        g_ms, wall_ms, g_all, wall_all = time_gpu(fn, a.gt_reps)
        frac = flops[name] / (g_ms * 1e-3 * H200_BF16_DENSE_PEAK)
        p = {
            "marker": "phase:" + name,
            "analytic_flops": flops[name],
            "flops_on_tensor_cores": tensor_core[name],
            "gpu_span_ms_median": g_ms,
            "wall_ms_median": wall_ms,
            "gpu_span_ms_all": g_all,
            "wall_ms_all": wall_all,
            "expected_fraction_of_bf16_peak": frac,
        }
        if name in bytes_moved:
            p["analytic_hbm_bytes"] = bytes_moved[name]
            p["expected_fraction_of_hbm_peak"] = bytes_moved[name] / (g_ms * 1e-3 * H200_HBM_PEAK)
        phases["phase:" + name] = p
        print(
            "  %-22s %10.3f ms gpu  %10.3f ms wall  %.3e FLOP  frac %.4f" % ("phase:" + name, g_ms, wall_ms, flops[name], frac),
            flush=True,
        )
    step_ms, step_wall, _, _ = time_gpu(w.one_train_step, 5)
    # --- torch's own FLOP counter on one train step (cross-check)
    fc_total = None
    try:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as fc:
            w.one_train_step()
        torch.cuda.synchronize()
        fc_total = int(fc.get_total_flops())
    except Exception as e:
        print("FlopCounterMode failed:", e)
    gt["phases"] = phases
    gt["train_step_detail"] = dict(
        gptf,
        batch=a.batch,
        seq=a.seq,
        d_model=a.d_model,
        n_layer=a.n_layer,
        n_head=a.n_head,
        vocab=a.vocab,
        steps_in_phase=a.train_steps,
        one_step_gpu_ms_median=step_ms,
        one_step_wall_ms_median=step_wall,
        one_step_fraction_of_bf16_peak=gptf["total_flops"] / (step_ms * 1e-3 * H200_BF16_DENSE_PEAK),
        torch_flop_counter_total_per_step=fc_total,
        optimizer="torch.optim.AdamW(fused=True), fp32 params, autocast bf16",
    )
    gt["config"] = vars(a)
    gt["conventions"] = {
        "peak_bf16_dense_flops": H200_BF16_DENSE_PEAK,
        "peak_hbm_bytes_per_s": H200_HBM_PEAK,
        "expected_fraction": "analytic_flops / (gpu_span_ms_median * 1e-3 * 989.4e12)",
        "gpu_span": "unprofiled cuda-event span: event recorded on the idle GPU right before the phase's "
        "first launch, event after its last op; median over gt_reps; includes any GPU idle "
        "inside the phase (host sleeps, launch gaps); excludes the 0.2 s gap before it",
        "wall": "perf_counter from before the first launch to after torch.cuda.synchronize() at the end",
        "mm_flops": "2*M*N*K per matmul",
        "gpt_flops": gpt_flops.__doc__.strip(),
        "memory_bound_flops": "1 mul + 1 add per element per iteration (fp32, not tensor cores); "
        "bytes = 2 in-place ops x (read + write) x 4 B x numel per iteration",
    }
    with open(os.path.join(outdir, "ground_truth.json"), "w") as f:
        json.dump(gt, f, indent=1)
    print(json.dumps({k: gt[k] for k in ("measured_mm", "measured_hbm")}, indent=1))


# ----------------------------------------------------------------------------- profiled runs
def profiled_run(w, a, outdir, mode):
    nvml_idx, uuid = nvml_index_for_cuda0()
    info = {"mode": mode, "nvml_index": nvml_idx, "cuda0_uuid": uuid, "config": vars(a), "TZ_env": os.environ.get("TZ")}
    pre = "" if mode == "kineto" else mode + "_"
    clock = [
        "# TZ env: %r; nvidia-smi dmon/query print local time of this host\n" % os.environ.get("TZ"),
        clock_snapshot("before_loggers"),
    ]
    sampler = NvmlSampler(nvml_idx, 0.010)
    smi = SmiLoggers(outdir, nvml_idx, prefix=pre)
    sampler.start()
    time.sleep(1.2)  # baseline for the loggers (dmon prints once a second)

    if mode == "kineto":
        from torch.profiler import ProfilerActivity, profile, record_function

        w.mark = record_function
        prof = profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, with_flops=True, with_stack=False
        )
        info["profile_start_wall_ns"] = time.time_ns()
        prof.start()
        windows = run_phases(w, a.idle)
        prof.stop()
        info["profile_stop_wall_ns"] = time.time_ns()
    else:  # nsys: NVTX ranges, capture range = cudaProfilerStart/Stop

        @contextlib.contextmanager
        def nvtx_mark(name):
            torch.cuda.nvtx.range_push(name)
            try:
                yield
            finally:
                torch.cuda.nvtx.range_pop()

        w.mark = nvtx_mark
        torch.cuda.synchronize()
        info["profile_start_wall_ns"] = time.time_ns()
        torch.cuda.profiler.start()
        with torch.autograd.profiler.emit_nvtx(record_shapes=True):
            windows = run_phases(w, a.idle)
        info["profile_stop_wall_ns"] = time.time_ns()

    time.sleep(1.0)
    smi.stop()
    nrows = sampler.stop(os.path.join(outdir, pre + "nvml_samples.csv"))
    clock.append(clock_snapshot("after_loggers"))
    with open(os.path.join(outdir, pre + "host_clock.txt"), "w") as f:
        f.writelines(clock)
    info["phase_windows"] = windows
    info["nvml_rows"] = nrows
    with open(os.path.join(outdir, pre + "run_info.json"), "w") as f:
        json.dump(info, f, indent=1)

    if mode == "kineto":
        raw = os.path.join(outdir, "kineto_single.pt.trace.json")
        prof.export_chrome_trace(raw)
        gz_file(raw)
    else:
        # outputs are written before cudaProfilerStop: nsys may end the app there
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    for wnd in windows:
        print("  %-22s %10.3f ms wall (profiled)" % (wnd["phase"], wnd["wall_ms"]), flush=True)


def gz_file(raw):
    size = os.path.getsize(raw)
    with open(raw, "rb") as fi, gzip.open(raw + ".gz", "wb", compresslevel=6) as fo:
        shutil.copyfileobj(fi, fo, 1 << 22)
    os.remove(raw)
    print("wrote %s.gz (%.1f MB json -> %.2f MB gz)" % (raw, size / 1e6, os.path.getsize(raw + ".gz") / 1e6))
    return size


def bench_run(w, a, outdir):
    """Big Kineto trace for benchmarks: calibrate bytes/step, then all phases with many train steps."""
    from torch.profiler import ProfilerActivity, profile, record_function

    def prof_():
        return profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, with_flops=True, with_stack=False
        )

    w.mark = record_function
    cal = os.path.join(outdir, "_calib.json")
    with prof_() as p:
        w.train_step(steps=4)
        torch.cuda.synchronize()
    p.export_chrome_trace(cal)
    per_step = os.path.getsize(cal) / 4
    os.remove(cal)
    steps = max(8, min(400, int(a.bench_mb * 1e6 / per_step)))
    print("bench: %.0f bytes/step -> %d train steps" % (per_step, steps), flush=True)
    a.train_steps = steps
    with prof_() as p:
        run_phases(w, a.idle)
    raw = os.path.join(outdir, "kineto_bench_big.pt.trace.json")
    t0 = time.time()
    p.export_chrome_trace(raw)
    print("export %.1f s" % (time.time() - t0))
    gz_file(raw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["none", "kineto", "nsys", "bench"], default="none")
    ap.add_argument("--out", default="out_single")
    ap.add_argument("--idle", type=float, default=0.2)
    ap.add_argument("--mm-n", type=int, default=8192)
    ap.add_argument("--compute-iters", type=int, default=10)
    ap.add_argument("--mem-bytes", type=int, default=1 << 30)
    ap.add_argument("--mem-iters", type=int, default=10)
    ap.add_argument("--launch-iters", type=int, default=1000)
    ap.add_argument("--stall-n", type=int, default=1024)
    ap.add_argument("--stall-iters", type=int, default=5)
    ap.add_argument("--stall-sleep", type=float, default=0.020)
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--gt-reps", type=int, default=3)
    ap.add_argument("--bench-mb", type=float, default=100.0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), flush=True)
    w = Workload(a)
    warm_up(w)
    if a.mode == "none":
        ground_truth(w, a, a.out)
    elif a.mode == "bench":
        bench_run(w, a, a.out)
    else:
        profiled_run(w, a, a.out, a.mode)
    print("done", a.mode, flush=True)


if __name__ == "__main__":
    main()
