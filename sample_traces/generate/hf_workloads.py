#!/usr/bin/env python3
"""Recordings of common public code with truth measured outside the trace (issue 13's workloads).

Each workload runs under the PyTorch profiler (or, for `llama_nsys`, under Nsight Systems) and writes, beside
its trace, `truth.json` with what the program itself measured:

  flops_per_step   torch.utils.flop_counter.FlopCounterMode over one step, run before profiling
  steps[i].gpu_ms  CUDA events recorded in-stream at the start and the end of each profiled step (the event
                   at a step's start completes when the GPU reaches it: max(enqueue, end of the work before))
  achieved_truth   Σ FLOPs / (Σ event time · peak of the precision the FLOPs ran at)

Workloads (--workload):
  llama_eager     HF transformers LlamaForCausalLM (random init from a LlamaConfig), bf16, fused AdamW,
                  GPU-bound loop without host syncs, ProfilerStep#N
  llama_compile   the same model under torch.compile (inductor)
  llama_fsdp2     the same model under FSDP2 (fully_shard per layer, bf16 params / fp32 reduce), one rank
  llama_generate  HF generate() greedy decode with a KV cache, each call inside record_function("generate")
  llama_memory    one training step with profile_memory=True (allocator events), peak memory as truth
  memory_pressure a ballast tensor fills --fill (0.92) of the GPU's memory, then 3 steps of small bf16 matmuls
                  with profile_memory=True: a rank close to its device's memory, truth from torch.cuda
  cuda_graph      HF Llama forward passes replayed from a CUDA graph (kernels without op shapes)
  fp8_gemm        torch._scaled_mm e4m3 GEMMs (range "fp8_gemm") next to bf16 torch.mm (range "bf16_gemm")
  blas_forms      the other matmul-class ops, each in a range of its own: int8 torch._int_mm (torchao's int8
                  dynamic quantisation), torch._addmm_activation (a Linear with its GELU in cuBLASLt's epilogue),
                  addbmm, the GEMV / dot family (mv, addmv, dot) and, where torch has it, FP8
                  torch.nn.functional.scaled_mm (aten::_scaled_mm_v2), int4 weight-only
                  torch._weight_int4pack_mm at M = 16 and 4096 (tinygemm, gpt-fast / torchao int4wo); truth = 2·M·N·K (2·N·K, 2·N) from the
                  program's own shapes (torch 2.11's FlopCounterMode counts none of them) and in-stream events
  flash_ops       FlashAttention 2's own ops (flash_attn::_flash_attn_forward / _backward), forward and backward,
                  per mask in a range: full, causal, HF's sliding window, a local window (run_flash's docstring)
  input_bound     a small MLP fed by a DataLoader whose __getitem__ sleeps (per-step ProfilerStep ranges)
  resnet50_amp    torchvision ResNet-50, channels_last, bf16 autocast, SGD (cuDNN convolutions)
  bert_amp        HF BertForMaskedLM (bert-base), seq 512, bf16 autocast, fp32 weights, fused AdamW
  vit_compile     timm ViT-B/16 under torch.compile, bf16 autocast
  moe_grouped     HF MixtralForCausalLM (8 experts, top-2), bf16, fused AdamW, experts through torch._grouped_mm
  moe_batched     the same with transformers' "batched_mm" experts backend (gathered weights, torch.bmm)
  moe_eager       the same with transformers' "eager" experts backend (a loop over the routed experts)
  llama_nsys      llama_eager under nsys: NVTX "train_step" ranges (torch.cuda.nvtx), no shapes recorded,
                  capture range = cudaProfilerStart/Stop (run it under `nsys profile --capture-range=...`)
  nsys_memory     memory_pressure's program for `nsys profile --cuda-memory-usage=true` over the whole process
                  (no capture range): a ballast fills --fill of the GPU, 3 NVTX "train_step"s (the last one
                  needs 1 GiB more: one cudaMalloc inside a warm step), then the ballast is freed and the cache
                  emptied (cudaFree); truth = torch.cuda's allocator counters and cudaMalloc / cudaFree counts

Run on a GPU (`GEN_DEVICE=cpu` only smoke-tests the code paths):
  python3 hf_workloads.py --workload llama_eager --out OUTDIR
"""

import argparse
import gzip
import json
import os
import re
import shutil
import sys
import time

import torch

DEVICE = os.environ.get("GEN_DEVICE", "cuda")
CUDA = DEVICE == "cuda"
# Dense datasheet peaks of the H200 SXM (NVIDIA H200 datasheet; the sparse figures halved).
PEAK = {"bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12, "tf32": 494.7e12, "int8": 1978.9e12, "fp32": 66.9e12}


# ----------------------------------------------------------------------------- timing
class StepTimer:
    """CUDA events in-stream at step boundaries (perf_counter on the CPU smoke test)."""

    def __init__(self):
        self.marks = []

    def mark(self):
        if CUDA:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def elapsed_ms(self):
        if CUDA:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:], strict=False)]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:], strict=False)]


def sync():
    if CUDA:
        torch.cuda.synchronize()


def flop_count(fn):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    sync()
    by_op = {str(k): int(v) for k, v in fc.get_flop_counts().get("Global", {}).items()}
    return int(fc.get_total_flops()), by_op


def causal_flops(total, by_op):
    """FlopCounterMode counts causal SDPA as full attention; the useful work of a causal mask is half of it."""
    sdpa = sum(v for k, v in by_op.items() if "scaled_dot_product" in k)
    return total - sdpa // 2, sdpa


def write_trace(prof, path):
    tmp = path[:-3]
    prof.export_chrome_trace(tmp)
    with open(tmp, "rb") as f, gzip.open(path, "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    os.remove(tmp)


def profiler(out, name, n_active, memory=False):
    from torch.profiler import ProfilerActivity, profile, schedule

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    path = os.path.join(out, f"{name}.pt.trace.json.gz")
    return profile(
        activities=acts,
        record_shapes=True,
        profile_memory=memory,
        schedule=schedule(wait=0, warmup=1, active=n_active, repeat=1),
        on_trace_ready=lambda p: write_trace(p, path),
    ), path


# ----------------------------------------------------------------------------- models
def llama(layers=8, hidden=1024, inter=2816, heads=16, kv_heads=8, vocab=32000):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        attn_implementation="sdpa",
        use_cache=False,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg), cfg


def small_sizes(a):
    if not CUDA:  # CPU smoke test
        a.layers, a.hidden, a.inter, a.heads, a.kv_heads, a.vocab, a.batch, a.seq = 2, 64, 128, 4, 2, 256, 2, 32


def train_setup(a, mode):
    small_sizes(a)
    model, cfg = llama(a.layers, a.hidden, a.inter, a.heads, a.kv_heads, a.vocab)
    info = {
        "config": {
            k: getattr(cfg, k)
            for k in (
                "num_hidden_layers",
                "hidden_size",
                "intermediate_size",
                "num_attention_heads",
                "num_key_value_heads",
                "vocab_size",
            )
        },
        "batch": a.batch,
        "seq": a.seq,
    }
    if mode == "fsdp2":
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("nccl" if CUDA else "gloo", rank=0, world_size=1)
        model = model.to(DEVICE)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        info["fsdp2"] = {"world_size": 1, "param_dtype": "bf16", "reduce_dtype": "fp32", "params": "fp32"}
    else:
        model = model.to(DEVICE, dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=CUDA)
    step_model = torch.compile(model) if mode == "compile" else model
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(DEVICE)

    def step(eager=False):
        out = (model if eager else step_model)(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, info


def other_setup(a):
    """Held-out training workloads (other model families, mixed precision by autocast, fp32 master weights)."""
    w = a.workload
    torch.manual_seed(0)
    g = torch.Generator(device="cpu").manual_seed(1)
    amp = torch.autocast(device_type="cuda" if CUDA else "cpu", dtype=torch.bfloat16)
    if w in ("resnet50_amp", "vit_compile"):
        b = a.img_batch if CUDA else 2
        if w == "resnet50_amp":
            import torchvision

            model = torchvision.models.resnet50().to(DEVICE, memory_format=torch.channels_last)
            info = {"model": "torchvision resnet50", "channels_last": True}
        else:
            import timm

            model = timm.create_model("vit_base_patch16_224", pretrained=False).to(DEVICE)
            info = {"model": "timm vit_base_patch16_224"}
        x = torch.randn(b, 3, 224, 224, generator=g).to(DEVICE)
        if w == "resnet50_amp":
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (b,), generator=g).to(DEVICE)
        fwd = torch.compile(model) if w == "vit_compile" else model
        opt = (
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            if w == "resnet50_amp"
            else torch.optim.AdamW(model.parameters(), lr=1e-4, fused=CUDA)
        )

        def loss(eager=False):
            with amp:
                return torch.nn.functional.cross_entropy((model if eager else fwd)(x), y)

        info.update(batch=b, image=224)
    elif w == "bert_amp":
        from transformers import BertConfig, BertForMaskedLM

        cfg = (
            BertConfig()
            if CUDA
            else BertConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=256)
        )
        cfg._attn_implementation = "sdpa"
        model = BertForMaskedLM(cfg).to(DEVICE)
        b, t = (a.bert_batch, 512) if CUDA else (2, 32)
        ids = torch.randint(0, cfg.vocab_size, (b, t), generator=g).to(DEVICE)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=CUDA)

        def loss(eager=False):
            with amp:
                return model(input_ids=ids, labels=ids).loss

        info = {"model": "HF BertForMaskedLM (bert-base config)", "batch": b, "seq": t}
    elif w in ("moe_grouped", "moe_batched", "moe_eager"):
        # Mixture of experts (HF Mixtral, random init): the experts run through transformers' experts backend —
        # "grouped_mm" (torch._grouped_mm: one grouped GEMM per projection), "batched_mm" (each token's experts'
        # weights gathered, one torch.bmm) or "eager" (a loop over the experts that were routed tokens, each an
        # aten::linear on its tokens; finding them syncs the host)
        from transformers import MixtralConfig, MixtralForCausalLM

        H, inter, layers, heads = (a.moe_hidden, a.moe_inter, a.moe_layers, 16) if CUDA else (64, 128, 2, 4)
        cfg = MixtralConfig(
            vocab_size=a.vocab if CUDA else 256,
            hidden_size=H,
            intermediate_size=inter,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,  # MHA: FlopCounterMode cannot count GQA SDPA
            num_local_experts=a.experts,
            num_experts_per_tok=a.top_k,
            max_position_embeddings=4096,
            attn_implementation="sdpa",
            use_cache=False,
            tie_word_embeddings=False,
            output_router_logits=False,
        )
        torch.manual_seed(0)
        model = MixtralForCausalLM(cfg).to(DEVICE, dtype=torch.bfloat16)
        model.set_experts_implementation({"moe_grouped": "grouped_mm", "moe_batched": "batched_mm"}.get(w, "eager"))
        b, t = (a.batch, a.moe_seq) if CUDA else (2, 32)
        ids = torch.randint(0, cfg.vocab_size, (b, t), generator=g).to(DEVICE)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=CUDA)

        def loss(eager=False):
            return model(input_ids=ids, labels=ids).loss

        # every token goes through top_k experts' three projections (gate, up: H -> inter; down: inter -> H), the
        # backward twice the forward: what the experts multiply, whatever the backend
        info = {
            "model": "HF MixtralForCausalLM (random init)",
            "experts_implementation": model.get_experts_implementation(),
            "config": {
                "hidden": H,
                "expert_inter": inter,
                "layers": layers,
                "heads": heads,
                "experts": a.experts,
                "top_k": a.top_k,
            },
            "batch": b,
            "seq": t,
            "expert_flops_per_step_analytic": 3 * 2 * b * t * a.top_k * 3 * H * inter * layers,
            "precision": "bf16",
            "causal": True,
        }
    else:
        raise SystemExit(f"unknown workload {w}")

    def step(eager=False):
        loss(eager).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    info.setdefault("precision", "bf16 autocast, fp32 weights")
    return step, info


def run_training(a, mode):
    step, info = other_setup(a) if mode == "other" else train_setup(a, mode)
    t0 = time.time()
    for _ in range(a.warmup):  # compile, cuBLAS handles, allocator, optimizer state
        step()
    sync()
    info["warmup_s"] = time.time() - t0
    # FLOPs of one step, counted by torch itself (matmuls and SDPA, forward and backward), on the eager model: a
    # compiled model run under FlopCounterMode (a dispatch mode) ran eager from then on — the *_compile recordings
    # made that way (before 2026-12-05) held no Triton kernel
    info["flops_per_step"], info["flops_by_op"] = flop_count(lambda: step(eager=True))
    sync()
    n = a.steps
    prof, path = profiler(a.out, a.workload, n)
    timer = StepTimer()
    with prof:
        for i in range(n + 1):  # step 0 is the profiler's warm-up step
            if i == 1:
                timer.mark()
            step()
            if i >= 1:
                timer.mark()
            prof.step()
    sync()
    ms = timer.elapsed_ms()
    info.update(
        trace=os.path.basename(path),
        profiled_steps=n,
        steps=[{"profiler_step": f"ProfilerStep#{i + 1}", "gpu_ms": m} for i, m in enumerate(ms)],
        gpu_ms_total=sum(ms),
    )
    if a.workload.endswith("_compile"):  # the compiled kernels the trace holds (none: the compile did not run)
        with gzip.open(os.path.join(a.out, info["trace"]), "rt") as f:
            info["triton_kernels"] = len(re.findall(r'"name":\s*"triton_', f.read()))
    info.setdefault("precision", "bf16")
    info["achieved_truth"] = info["flops_per_step"] * n / (sum(ms) / 1e3) / PEAK["bf16"]
    if mode != "other" or info.get("causal"):  # Llama's and Mixtral's SDPA is causal; BERT's and ViT's are not
        info["flops_per_step_causal"], info["sdpa_flops_per_step"] = causal_flops(info["flops_per_step"], info["flops_by_op"])
        info["achieved_truth_causal"] = info["flops_per_step_causal"] * n / (sum(ms) / 1e3) / PEAK["bf16"]
    if mode == "fsdp2":
        import torch.distributed as dist

        dist.destroy_process_group()
    return info


def run_memory(a):
    step, info = train_setup(a, "eager")
    for _ in range(a.warmup):
        step()
    sync()
    prof, path = profiler(a.out, a.workload, 1, memory=True)
    with prof:
        step()
        prof.step()
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
            base_alloc, base_res = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        step()
        sync()
        if CUDA:
            info["memory"] = {
                "allocated_at_step_start_bytes": base_alloc,
                "reserved_at_step_start_bytes": base_res,
                "max_allocated_bytes": torch.cuda.max_memory_allocated(),
                "max_reserved_bytes": torch.cuda.max_memory_reserved(),
                "device_total_bytes": torch.cuda.get_device_properties(0).total_memory,
            }
        prof.step()
    info.update(trace=os.path.basename(path), profiled_steps=1)
    return info


def run_memory_pressure(a):
    """A program that runs close to its GPU's memory: a ballast tensor brings the caching allocator's reserved
    memory to `--fill` of the device (torch.cuda.get_device_properties().total_memory, the trace's
    totalGlobalMem), then 3 profiled steps of 4096² bf16 matmuls allocate and free their outputs on top of it."""
    n, k = (4096, 8) if CUDA else (64, 2)
    x = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)

    def step():
        y = x
        for _ in range(k):
            y = torch.relu(y @ w) * 0.01  # a new output (and a temporary) per matmul: the allocator works
        return y.sum()

    step()
    sync()
    info = {"matmul": [n, n, n], "matmuls_per_step": k, "fill": a.fill}
    if CUDA:
        total = torch.cuda.get_device_properties(0).total_memory
        ballast_bytes = int(a.fill * total) - torch.cuda.memory_reserved()
        ballast = torch.empty(max(ballast_bytes, 0), dtype=torch.uint8, device=DEVICE)  # noqa: F841 (held)
        for _ in range(a.warmup):
            step()
        sync()
        torch.cuda.reset_peak_memory_stats()
    prof, path = profiler(a.out, a.workload, 3, memory=True)
    with prof:
        step()
        prof.step()
        for _ in range(3):
            step()
            prof.step()
        sync()
    if CUDA:
        free, total_now = torch.cuda.mem_get_info()
        st = torch.cuda.memory_stats()
        info["memory"] = {
            "ballast_bytes": ballast_bytes,
            "max_allocated_bytes": torch.cuda.max_memory_allocated(),
            "max_reserved_bytes": torch.cuda.max_memory_reserved(),
            "device_total_bytes": total,
            "mem_get_info_free_bytes": free,
            "mem_get_info_total_bytes": total_now,
            "num_alloc_retries": st.get("num_alloc_retries"),
            "num_ooms": st.get("num_ooms"),
            "max_reserved_fraction": torch.cuda.max_memory_reserved() / total,
            "max_allocated_fraction": torch.cuda.max_memory_allocated() / total,
        }
    info.update(trace=os.path.basename(path), profiled_steps=3)
    return info


def run_nsys_memory(a):
    """The memory_pressure program, to be run under `nsys profile --cuda-memory-usage=true` with the whole process
    captured, so that the report holds every device allocation the process made. The truth is the caching
    allocator's own counters: reserved is what it holds from the driver (the sum of its cudaMalloc'd segments),
    allocated what live tensors use; num_device_alloc / num_device_free count its cudaMalloc / cudaFree calls."""
    n, k = (4096, 8) if CUDA else (64, 2)
    x = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)

    def step(extra_bytes=0):
        y = x
        extra = torch.empty(extra_bytes, dtype=torch.uint8, device=DEVICE) if extra_bytes else None
        for _ in range(k):
            y = torch.relu(y @ w) * 0.01
        s = y.sum()
        del extra  # back to the cache, not to the driver
        return s

    def snap(tag):
        if not CUDA:
            return {"tag": tag}
        free, total = torch.cuda.mem_get_info()
        st = torch.cuda.memory_stats()
        return {
            "tag": tag,
            "wall_ns": time.time_ns(),
            "reserved_bytes": torch.cuda.memory_reserved(),
            "allocated_bytes": torch.cuda.memory_allocated(),
            "max_reserved_bytes": torch.cuda.max_memory_reserved(),
            "max_allocated_bytes": torch.cuda.max_memory_allocated(),
            "num_device_alloc": st.get("num_device_alloc"),
            "num_device_free": st.get("num_device_free"),
            "mem_get_info_used_bytes": total - free,
        }

    nvtx = torch.cuda.nvtx if CUDA else None
    step()
    sync()
    info = {"matmul": [n, n, n], "matmuls_per_step": k, "fill": a.fill, "extra_last_step_bytes": 2**30}
    snaps = [snap("after_first_step")]
    total = torch.cuda.get_device_properties(0).total_memory if CUDA else 0
    ballast_bytes = max(int(a.fill * total) - (torch.cuda.memory_reserved() if CUDA else 0), 0)
    ballast = torch.empty(ballast_bytes, dtype=torch.uint8, device=DEVICE)
    for _ in range(a.warmup):
        step()
    sync()
    snaps.append(snap("after_warmup"))
    for i in range(a.steps):
        nvtx.range_push("train_step") if nvtx else None
        step(2**30 if i == a.steps - 1 else 0)
        sync()
        nvtx.range_pop() if nvtx else None
    snaps.append(snap("after_steps"))
    if CUDA:
        try:  # the native allocator's segments (each one cudaMalloc); other backends may not have them
            segs = torch.cuda.memory_snapshot()
            info["segments_before_release"] = {
                "count": len(segs),
                "total_size_bytes": sum(s["total_size"] for s in segs),
                "sizes_bytes": sorted((s["total_size"] for s in segs), reverse=True),
            }
        except Exception as e:  # noqa: BLE001
            info["segments_before_release"] = {"error": str(e)[:200]}
    nvtx.range_push("release") if nvtx else None
    del ballast
    if CUDA:
        torch.cuda.empty_cache()
    sync()
    nvtx.range_pop() if nvtx else None
    snaps.append(snap("after_release"))
    if CUDA:
        st = torch.cuda.memory_stats()
        info["memory"] = {
            "ballast_bytes": ballast_bytes,
            "max_allocated_bytes": torch.cuda.max_memory_allocated(),
            "max_reserved_bytes": torch.cuda.max_memory_reserved(),
            "reserved_at_end_bytes": torch.cuda.memory_reserved(),
            "device_total_bytes": total,
            "max_reserved_fraction": torch.cuda.max_memory_reserved() / total,
            "num_device_alloc": st.get("num_device_alloc"),
            "num_device_free": st.get("num_device_free"),
            "num_alloc_retries": st.get("num_alloc_retries"),
            "num_ooms": st.get("num_ooms"),
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "allocator_backend": torch.cuda.get_allocator_backend(),
        }
    info["snapshots"] = snaps
    info.update(profiled_steps=a.steps, capture="whole process (no capture range)")
    return info


def run_generate(a):
    small_sizes(a)
    model, cfg = llama(a.gen_layers if CUDA else a.layers, a.hidden, a.inter, a.heads, a.kv_heads, a.vocab)
    model.config.use_cache = True
    model = model.to(DEVICE, dtype=torch.bfloat16).eval()
    g = torch.Generator(device="cpu").manual_seed(2)
    ids = torch.randint(0, a.vocab, (a.gen_batch, a.gen_prompt), generator=g).to(DEVICE)
    kw = dict(max_new_tokens=a.gen_tokens, min_new_tokens=a.gen_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)

    def gen():
        with torch.no_grad():
            return model.generate(ids, **kw)

    for _ in range(2):
        gen()
    sync()
    flops, by_op = flop_count(gen)
    from torch.profiler import record_function

    prof, path = profiler(a.out, a.workload, 1)
    timer = StepTimer()
    with prof:
        gen()
        prof.step()
        timer.mark()
        with record_function("generate"):
            out = gen()
        timer.mark()
        prof.step()
    ms = timer.elapsed_ms()
    return {
        "trace": os.path.basename(path),
        "config": {"num_hidden_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size},
        "batch": a.gen_batch,
        "prompt_tokens": a.gen_prompt,
        "new_tokens": int(out.shape[1] - ids.shape[1]),
        "flops_per_call": flops,
        "flops_by_op": by_op,
        "generate_gpu_ms": ms[0],
        "precision": "bf16",
        "achieved_truth": flops / (ms[0] / 1e3) / PEAK["bf16"],
        "flops_per_call_causal": causal_flops(flops, by_op)[0],
    }


def run_graph(a):
    """Forward passes replayed from a CUDA graph: the kernels carry no op shapes (their FLOPs are unknown to a
    trace reader unless the user gives them)."""
    from torch.profiler import record_function

    small_sizes(a)
    model, cfg = llama(a.gen_layers if CUDA else a.layers, a.hidden, a.inter, a.heads, a.kv_heads, a.vocab)
    model = model.to(DEVICE, dtype=torch.bfloat16).eval()
    g = torch.Generator(device="cpu").manual_seed(3)
    ids = torch.randint(0, a.vocab, (a.gen_batch, a.seq), generator=g).to(DEVICE)
    what = "HF LlamaForCausalLM forward"

    def fwd():
        with torch.no_grad():
            return model(input_ids=ids).logits

    if not CUDA:
        replay = fwd
    else:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fwd()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fwd()
        except Exception as e:  # HF code that syncs cannot be captured: fall back to a plain bf16 MLP
            import torch.nn as nn

            what = f"bf16 MLP (HF forward not capturable: {type(e).__name__})"
            model = nn.Sequential(*[nn.Linear(a.hidden, a.hidden, bias=False) for _ in range(8)]).to(DEVICE, torch.bfloat16)
            x = torch.randn(a.gen_batch * a.seq, a.hidden, device=DEVICE, dtype=torch.bfloat16)

            def fwd():  # noqa: F811
                with torch.no_grad():
                    return model(x)

            for _ in range(3):
                fwd()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fwd()
        replay = graph.replay
    flops, by_op = flop_count(fwd)
    reps = 5
    prof, path = profiler(a.out, a.workload, 1)
    timer = StepTimer()
    with prof:
        replay()
        prof.step()
        timer.mark()
        with record_function("graph_replays"):
            for _ in range(reps):
                replay()
        timer.mark()
        sync()
        prof.step()
    ms = timer.elapsed_ms()
    fl, _ = causal_flops(flops, by_op)
    return {
        "trace": os.path.basename(path),
        "what": what,
        "replays": reps,
        "flops_per_replay": flops,
        "flops_per_replay_causal": fl,
        "flops_by_op": by_op,
        "gpu_ms": ms[0],
        "precision": "bf16",
        "achieved_truth": flops * reps / (ms[0] / 1e3) / PEAK["bf16"],
        "achieved_truth_causal": fl * reps / (ms[0] / 1e3) / PEAK["bf16"],
    }


def run_fp8(a):
    n, reps = (8192, 20) if CUDA else (64, 2)
    info = {"M": n, "N": n, "K": n, "reps": reps}
    x = torch.randn(n, n, device=DEVICE)
    w = torch.randn(n, n, device=DEVICE)
    xb, wb = x.bfloat16(), w.bfloat16()
    have_fp8 = CUDA and torch.cuda.get_device_capability() >= (8, 9)
    if have_fp8:
        xf = x.to(torch.float8_e4m3fn)
        wf = w.to(torch.float8_e4m3fn).t()  # column-major second operand, as _scaled_mm needs
        one = torch.tensor(1.0, device=DEVICE)

    def fp8():
        return torch._scaled_mm(xf, wf, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    def bf16():
        return torch.mm(xb, wb)

    flops = 2 * n * n * n
    phases = [("bf16_gemm", "bf16", flops, bf16)] + ([("fp8_gemm", "fp8", flops, fp8)] if have_fp8 else [])
    for _, _, _, fn in phases:
        for _ in range(3):
            fn()
    return timed_ranges(a, phases, reps, info)


def run_blas(a):
    """blas_forms: per range, `reps` calls of one op on fixed shapes, an idle gap between the ranges. Truth per
    range: the FLOPs from the shapes the program chose (a multiply-add = 2 FLOPs), in-stream CUDA events around the
    calls, and what FlopCounterMode counts for one call (torch 2.11: nothing, for every one of these ops)."""
    import torch.nn.functional as F

    big, reps = (8192, 20) if CUDA else (64, 2)
    vec = 16384 if CUDA else 64
    bf = torch.bfloat16
    r = lambda *s, dt=bf: torch.randn(*s, device=DEVICE, dtype=dt)  # noqa: E731
    i8 = lambda *s: torch.randint(-8, 8, s, device=DEVICE, dtype=torch.int8)  # noqa: E731
    xi, wi = i8(big, big), i8(big, big).t()  # _int_mm: row-major A, column-major B (what cuBLAS's int8 path takes)
    x, w, bias = r(big, big), r(big, big), r(big)
    bat = 8
    c, b1, b2 = r(big // 2, big // 2), r(bat, big // 2, big // 4), r(bat, big // 4, big // 2)
    mat, v, y = r(vec, vec), r(vec), r(vec)
    d1, d2 = r(vec * vec, dt=torch.float32), r(vec * vec, dt=torch.float32)
    ops = [  # (range, precision, FLOPs of one call, the call)
        ("int8_mm", "int8", 2 * big**3, lambda: torch._int_mm(xi, wi)),
        ("addmm_gelu", "bf16", 2 * big**3, lambda: torch.ops.aten._addmm_activation(bias, x, w, use_gelu=True)),
        ("addbmm", "bf16", 2 * bat * (big // 2) * (big // 4) * (big // 2), lambda: torch.addbmm(c, b1, b2)),
        ("mv", "bf16", 2 * vec * vec, lambda: torch.mv(mat, v)),
        ("addmv", "bf16", 2 * vec * vec, lambda: torch.addmv(y, mat, v)),
        ("dot", "fp32", 2 * vec * vec, lambda: torch.dot(d1, d2)),
    ]
    if CUDA and torch.cuda.get_device_capability() >= (8, 9) and hasattr(F, "scaled_mm"):
        # torch.nn.functional.scaled_mm (torch ≥ 2.10): aten::_scaled_mm_v2, its scales and recipes as lists
        xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device=DEVICE)
        tw = F.ScalingType.TensorWise
        ops.append(("scaled_mm_v2", "fp8", 2 * big**3, lambda: F.scaled_mm(xf, wf, one, tw, one, tw, output_dtype=bf)))
    if CUDA and torch.cuda.get_device_capability() >= (8, 0):
        # int4 weight-only (gpt-fast, torchao's int4wo: tinygemm): bf16 activations [M, K] times a weight packed
        # from 4-bit values [N, K] with one bf16 scale and zero per group of 128 along K ([K / 128, N, 2]); a
        # decode-sized M and a prefill-sized one
        try:
            w4 = torch._convert_weight_to_int4pack(torch.randint(0, 256, (big, big // 2), device=DEVICE, dtype=torch.uint8), 8)
            sz = r(big // 128, big, 2)
            for m in (16, 4096):
                xa = r(m, big)
                torch._weight_int4pack_mm(xa, w4, 128, sz)
                ops.append(
                    (f"int4_weight_mm_m{m}", "bf16", 2 * m * big * big, lambda xa=xa: torch._weight_int4pack_mm(xa, w4, 128, sz))
                )
        except (RuntimeError, AttributeError) as e:  # not built for this GPU / torch
            print("int4 weight-only matmul not run:", e)
    counted = {}
    for name, _, _, fn in ops:
        for _ in range(3):
            fn()
        total, by_op = flop_count(fn)
        counted[name] = {"total": total, "by_op": by_op}
    info = timed_ranges(a, ops, reps, {"reps": reps})
    for name, phase in info["phases"].items():
        phase["flop_counter_per_call"] = counted[name]
    return info


def timed_ranges(a, ops, reps, info):
    """One profiled step: per (range, precision, FLOPs of one call, the call) in `ops`, `reps` calls inside
    record_function(range), an idle gap between the ranges; the first op's call in a warm-up step before. Truth per
    range (info["phases"]): its FLOPs (`reps` calls) and in-stream CUDA events around its calls."""
    from torch.profiler import record_function

    sync()
    prof, path = profiler(a.out, a.workload, 1)
    timer = StepTimer()
    with prof:
        ops[0][3]()
        prof.step()
        for name, _, _, fn in ops:
            sync()
            time.sleep(0.05)  # an idle gap between the ranges
            timer.mark()
            with record_function(name):
                for _ in range(reps):
                    fn()
                timer.mark()
                sync()
        prof.step()
    ms = timer.elapsed_ms()
    info["trace"] = os.path.basename(path)
    info["phases"] = {}
    for i, (name, prec, flops, _) in enumerate(ops):
        gpu_ms = ms[2 * i]  # mark pairs: (start, end) per range; ms[2i+1] is the gap to the next one
        total = flops * reps
        info["phases"][name] = {
            "flops": total,
            "precision": prec,
            "gpu_ms": gpu_ms,
            "achieved_truth": total / (gpu_ms / 1e3) / PEAK[prec],
            "tflops": total / (gpu_ms / 1e3) / 1e12,
        }
    return info


def run_flash(a):
    """flash_ops: FlashAttention 2 as HF's attn_implementation="flash_attention_2" calls it (flash_attn_func on
    (batch, seqlen, heads, head dim) bf16 tensors), forward and backward, per mask in a range of its own: full,
    causal, causal with a sliding window as HF passes Mistral's (window_size = (W − 1, W − 1)), and a non-causal
    local window. The flash_attn package when it imports, else flash_lookalike.py's ops of the same names and
    signatures (our Triton kernels). Truth per range: FLOPs = 2·B·H·D·2·(pairs the mask keeps, brute force) forward,
    2.5× that backward (FlashAttention's count: 2 matmuls forward, 5 backward), checked against FlopCounterMode on
    SDPA for the full and causal masks (FlopCounterMode counts causal as full); in-stream CUDA events; the kernels'
    results against SDPA on the same mask."""
    try:
        from flash_attn import flash_attn_func

        source = "flash_attn " + __import__("flash_attn").__version__
    except ImportError:
        from flash_lookalike import flash_attn_func

        source = "flash_lookalike.py (flash_attn's op signatures, our Triton kernels)"
    from flash_lookalike import check, keep_mask

    b, lq, h, dim = (4, 4096, 16, 128) if CUDA else (1, 128, 2, 16)
    reps = 10 if CUDA else 1
    w = lq // 4
    dt = torch.bfloat16 if CUDA else torch.float32
    g = torch.Generator(device="cpu").manual_seed(5)
    q, k, v = (torch.randn(b, lq, h, dim, generator=g).to(DEVICE, dt).requires_grad_() for _ in range(3))
    dout = torch.randn(b, lq, h, dim, generator=g).to(DEVICE, dt)
    masks = [
        ("fa_full", False, (-1, -1)),
        ("fa_causal", True, (-1, -1)),
        ("fa_sliding", True, (w - 1, w - 1)),
        ("fa_local", False, (w // 2, w // 2)),
    ]
    ops, info = [], {"source": source, "shape_bshd": [b, lq, h, dim], "reps": reps, "masks": {}}
    for name, causal, window in masks:
        pairs = int(keep_mask(lq, lq, causal, window).sum())
        fwd = 2 * b * h * pairs * 2 * dim

        def step(causal=causal, window=window):
            out = flash_attn_func(q, k, v, causal=causal, window_size=window)
            return torch.autograd.grad(out, (q, k, v), dout)

        errors = check(q, k, v, causal, window, fn=flash_attn_func)
        info["masks"][name] = {
            "causal": causal,
            "window": list(window),
            "pairs": pairs,
            "fwd_flops": fwd,
            "max_abs_err_out_dq_dk_dv": errors,
        }
        ops.append((name, "bf16", fwd * 7 // 2, step))  # forward + backward (2.5×)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    for causal in (False, True):

        def sdpa(causal=causal):
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            torch.autograd.grad(out, (qt, kt, vt), dout.transpose(1, 2))

        total, by_op = flop_count(sdpa)
        info["masks"]["fa_causal" if causal else "fa_full"]["flop_counter_sdpa_fwd_bwd"] = {"total": total, "by_op": by_op}
    for _, _, _, fn in ops:
        for _ in range(3):
            fn()
    return timed_ranges(a, ops, reps, info)


def run_overlap(a):
    """Two streams, DualPipe-like: per iteration, `dispatch` makes a side stream wait for the compute stream (an
    event) and launches a GEMM there, then `mlp` launches eight GEMMs on the compute stream. The host runs ahead;
    on the GPU both start when the previous mlp ends, and the side GEMM, launched first, runs beside the first few
    of mlp's and ends before its last. Truth: CUDA events recorded in-stream around each range's own work on its
    own stream — the event before mlp's first GEMM completes when the compute stream reaches it, the one on the side
    stream when its wait is over (each window's start by SPEC §1), the one after the last GEMM when that ends."""
    from torch.profiler import record_function

    n, iters, mlp_mms = (4096, 6, 8) if CUDA else (64, 2, 2)
    side = torch.cuda.Stream() if CUDA else None
    xa = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    wa = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    xs = torch.randn(2 * n, n, device=DEVICE, dtype=torch.bfloat16)

    def event():
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def iteration(marks):
        with record_function("dispatch"):
            if CUDA:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    e0 = event()
                    torch.mm(xs, wa)  # 2n × n × n: about four of mlp's GEMMs alone
                    e1 = event()
            else:
                e0 = e1 = None
                torch.mm(xs, wa)
        with record_function("mlp"):
            f0 = event() if CUDA else None
            for _ in range(mlp_mms):
                torch.mm(xa, wa)
            f1 = event() if CUDA else None
        marks.append((e0, e1, f0, f1))

    for _ in range(3):
        iteration([])
    sync()
    prof, path = profiler(a.out, a.workload, 1)
    marks: list = []
    with prof:
        torch.mm(xa, wa)
        prof.step()
        for _ in range(iters):
            iteration(marks)
        sync()
        prof.step()
    sync()
    mm = 2 * n**3
    occ = []
    for e0, e1, f0, f1 in marks:
        d = e0.elapsed_time(e1) if CUDA else None
        m = f0.elapsed_time(f1) if CUDA else None
        occ.append({"dispatch_gpu_ms": d, "mlp_gpu_ms": m})
    info = {
        "n": n,
        "iterations": iters,
        "mlp_mms": mlp_mms,
        "trace": os.path.basename(path),
        "dispatch_flops": 2 * mm,
        "mlp_flops": mlp_mms * mm,
        "occurrences": occ,
    }
    if CUDA:
        # each side GEMM runs inside its iteration's mlp window: the GPU's FLOPs there are both ranges'
        info["mlp_gpu_ms_total"] = sum(o["mlp_gpu_ms"] for o in occ)
        info["dispatch_gpu_ms_total"] = sum(o["dispatch_gpu_ms"] for o in occ)
        info["mlp_window_achieved_truth"] = iters * (mlp_mms + 2) * mm / (info["mlp_gpu_ms_total"] / 1e3) / PEAK["bf16"]
    return info


def run_input_bound(a):
    import torch.nn as nn

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            time.sleep(a.sleep_ms / 1e3)
            return torch.full((1024,), float(i % 7))

    d = 2048 if CUDA else 64
    model = nn.Sequential(nn.Linear(1024, d), nn.GELU(), nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1024)).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(Slow(), batch_size=a.loader_batch, num_workers=0)
    it = iter(loader)
    fetch_ms = []

    def step(record):
        t0 = time.perf_counter()
        x = next(it).to(DEVICE, non_blocking=False)
        if record:
            fetch_ms.append((time.perf_counter() - t0) * 1e3)
        for _ in range(4):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step(False)
    sync()
    n = a.steps
    prof, path = profiler(a.out, a.workload, n)
    timer = StepTimer()
    with prof:
        for i in range(n + 1):
            if i == 1:
                timer.mark()
            step(i >= 1)
            if i >= 1:
                timer.mark()
            prof.step()
    ms = timer.elapsed_ms()
    return {
        "trace": os.path.basename(path),
        "profiled_steps": n,
        "sleep_ms_per_sample": a.sleep_ms,
        "loader_batch": a.loader_batch,
        "fetch_ms": fetch_ms,
        "steps": [{"profiler_step": f"ProfilerStep#{i + 1}", "gpu_ms": m} for i, m in enumerate(ms)],
        "gpu_ms_total": sum(ms),
    }


def run_nsys(a):
    step, info = train_setup(a, "eager")
    for _ in range(a.warmup):
        step()
    sync()
    info["flops_per_step"], info["flops_by_op"] = flop_count(step)
    n = a.steps
    timer = StepTimer()
    sync()
    if CUDA:
        torch.cuda.cudart().cudaProfilerStart()
    timer.mark()
    for _i in range(n):
        torch.cuda.nvtx.range_push("train_step") if CUDA else None
        step()
        torch.cuda.nvtx.range_pop() if CUDA else None
        timer.mark()
    ms = timer.elapsed_ms()
    info.update(
        profiled_steps=n,
        steps=[{"range": "train_step", "occurrence": i, "gpu_ms": m} for i, m in enumerate(ms)],
        gpu_ms_total=sum(ms),
        precision="bf16",
        achieved_truth=info["flops_per_step"] * n / (sum(ms) / 1e3) / PEAK["bf16"],
    )
    info["flops_per_step_causal"], info["sdpa_flops_per_step"] = causal_flops(info["flops_per_step"], info["flops_by_op"])
    info["achieved_truth_causal"] = info["flops_per_step_causal"] * n / (sum(ms) / 1e3) / PEAK["bf16"]
    # nsys --capture-range-end=stop ends the program at cudaProfilerStop: write the truth first
    finish(a, info)
    if CUDA:
        torch.cuda.cudart().cudaProfilerStop()
    return info


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workload", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=5632)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=16)  # MHA: FlopCounterMode cannot count GQA SDPA
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--gen-layers", type=int, default=4)
    p.add_argument("--gen-batch", type=int, default=4)
    p.add_argument("--gen-prompt", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=16)
    p.add_argument("--sleep-ms", type=float, default=2.0)
    p.add_argument("--loader-batch", type=int, default=16)
    p.add_argument("--img-batch", type=int, default=128)
    p.add_argument("--bert-batch", type=int, default=32)
    p.add_argument("--fill", type=float, default=0.92)  # memory_pressure: share of the GPU's memory reserved
    p.add_argument("--experts", type=int, default=8)  # moe_*: experts per layer, experts per token, sizes
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--moe-layers", type=int, default=4)
    p.add_argument("--moe-hidden", type=int, default=1024)
    p.add_argument("--moe-inter", type=int, default=2816)
    p.add_argument("--moe-seq", type=int, default=1024)
    p.add_argument("--name", default=None)  # the truth file's name (default: the workload's)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    w = a.workload
    t0 = time.time()
    if w in ("llama_eager", "llama_compile", "llama_fsdp2"):
        info = run_training(a, w.split("_")[1])
    elif w in ("resnet50_amp", "bert_amp", "vit_compile", "moe_grouped", "moe_batched", "moe_eager"):
        info = run_training(a, "other")
    elif w == "llama_memory":
        info = run_memory(a)
    elif w == "memory_pressure":
        info = run_memory_pressure(a)
    elif w == "llama_generate":
        info = run_generate(a)
    elif w == "cuda_graph":
        info = run_graph(a)
    elif w == "fp8_gemm":
        info = run_fp8(a)
    elif w == "blas_forms":
        info = run_blas(a)
    elif w == "flash_ops":
        info = run_flash(a)
    elif w == "input_bound":
        info = run_input_bound(a)
    elif w == "overlap":
        info = run_overlap(a)
    elif w == "llama_nsys":
        info = run_nsys(a)
    elif w == "nsys_memory":
        info = run_nsys_memory(a)
    else:
        sys.exit(f"unknown workload {w}")
    finish(a, info, t0)


def finish(a, info, t0=None):
    info["workload"] = a.workload
    if t0 is not None:
        info["wall_s"] = time.time() - t0
    info["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    try:
        import transformers

        info["versions"]["transformers"] = transformers.__version__
    except ImportError:
        pass
    if CUDA:
        info["gpu"] = torch.cuda.get_device_name(0)
    with open(os.path.join(a.out, f"{a.name or a.workload}.truth.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps({k: v for k, v in info.items() if k not in ("flops_by_op",)})[:1500])


if __name__ == "__main__":
    main()
