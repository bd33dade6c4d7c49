"""PR504 gpu-idle-gap: fires on the committed host-stall phase (20 ms sleeps after syncs), names the range that
covers a gap (the DDP sample's `late_rank_sleep`), reports start-up apart (never as gaps to fill), silent on
compute-bound work."""

from __future__ import annotations

from ...conftest import annotation, cpu_op, kernel, write_trace
from ..expect import Expect, Near, analyse, check, ddp_sample, single_phase, truth
from ..traces import runtime


def test_fires_on_the_host_stall_phase():
    cfg = truth("h200_single/kineto_run_info.json")["config"]
    check(
        single_phase("host_stall"),
        [
            Expect(
                "PR504",
                key="gaps",
                evidence={
                    "gap_count": cfg["stall_iters"],
                    "main_category": "sync_stall",
                    "gaps.0.duration_ns": Near(cfg["stall_sleep"] * 1e9, rel=0.1, truth="the 20 ms sleep"),
                    "gaps.0.after_op": "aten::item",
                    "gaps.0.host": "nothing traced on the host",
                    "startup_gap_count": 0,
                },
                says=[r"PR502"],
            )
        ],
    )


def test_names_the_range_that_covers_a_gap():
    # ground_truth.json: rank 1 sleeps 30 ms inside a `late_rank_sleep` range before every backward.
    t = truth("h200x2_ddp/ground_truth.json")
    v = ddp_sample()
    f = [x for x in v["findings"] if x["rule"] == "PR504" and x["key"] == "gaps"]
    assert f
    gaps = [g for g in f[0]["evidence"]["gaps"] if g["rank"] == t["late_rank"]]
    assert gaps and all(g["covering_range"] == "late_rank_sleep" for g in gaps), gaps
    assert all(g["host"] == "host in range late_rank_sleep" for g in gaps)
    assert all(Near(t["late_sleep_s"] * 1e9, rel=0.15, truth="late_sleep_s").holds(g["duration_ns"]) for g in gaps)


def test_start_up_is_reported_apart(tmp_path):
    # Construction: the process's first CUDA call (cudaFree(0), 50 ms: context creation) before any kernel, then
    # 2 ms of work.
    ev = [runtime("cudaFree", 0.0, 50_000.0, corr=1)]
    for i in range(4):
        ev += [
            runtime("cudaLaunchKernel", 50_010.0 + i * 500.0, 3.0, corr=10 + i),
            kernel("work_kernel", 50_020.0 + i * 500.0, 480.0, 0, 10 + i),
        ]
    v = analyse([write_trace(tmp_path / "startup.json", ev)])
    check(
        v,
        [
            Expect(
                "PR504",
                key="startup",
                category="startup",
                evidence={
                    "gap_count": 1,
                    "startup_calls": ["cudaFree"],
                    "idle_ns": Near(50e6, rel=0.01, truth="construction: 50 ms"),
                },
                says=[r"one-time start-up"],
                never_says=[r"\bfill\b", r"launch-bound", r"CUDA graph"],
            )
        ],
        silent=["PR501"],
    )
    assert not [f for f in v["findings"] if f["rule"] == "PR504" and f["key"] == "gaps"]


def test_silent_on_compute_bound():
    check(single_phase("compute_bound"), [], silent=["PR504"])


def test_a_gap_is_classed_by_its_own_gpu_not_another_one_idle_meanwhile(tmp_path):
    """A gap's categories are the losses of its own GPU (a range join on the times, the rank and device a filter:
    see `context.residual`), never those of another GPU idle at the same time. Construction: two ranks with the
    same clock, 1 ms of kernels each, then 50 ms without a kernel, then 2 ms of kernels — rank 0 waits in a
    cudaStreamSynchronize that returns as its GPU drains (a sync stall), rank 1 has nothing traced on the host."""
    paths = []
    for rank in (0, 1):
        ev = []
        for i in range(4):
            ev += [
                runtime("cudaLaunchKernel", i * 250.0, 3.0, corr=10 + i),
                kernel("work_kernel", 5.0 + i * 250.0, 240.0, 0, 10 + i),
            ]
        if rank == 0:
            ev.append(runtime("cudaStreamSynchronize", 1_000.0, 250.0, corr=20))
        for i in range(4):
            t = 51_250.0 + i * 500.0
            ev += [runtime("cudaLaunchKernel", t, 3.0, corr=30 + i), kernel("work_kernel", t + 5.0, 490.0, 0, 30 + i)]
        paths.append(write_trace(tmp_path / f"rank{rank}.json", ev, rank=rank))
    v = analyse(paths)
    f = [x for x in v["findings"] if x["rule"] == "PR504" and x["key"] == "gaps"]
    assert f, [x["rule"] for x in v["findings"]]
    gaps = {g["rank"]: g for g in f[0]["evidence"]["gaps"]}
    assert set(gaps) == {0, 1}, gaps
    assert gaps[0]["main_category"] == "sync_stall", gaps[0]
    assert "sync_stall" not in gaps[1]["categories"], gaps[1]
    # each gap's categories add up to its own idle time, not to both GPUs' (50 ms, to 1%)
    for g in gaps.values():
        assert Near(g["duration_ns"], rel=0.01, truth="construction: one GPU's gap").holds(sum(g["categories"].values())), g


def test_the_host_work_of_the_largest_gap_is_not_said_of_them_all(tmp_path):
    # Construction: three 5 ms idle gaps with nothing traced on the host, and one 8 ms gap during which the host
    # runs `my_preprocess`: what the host did is known for that gap only, so the fix names it as the largest's.
    ev, corr, t = [], 10, 0.0
    for idle_us, op in ((5_000.0, None), (8_000.0, "my_preprocess"), (5_000.0, None), (5_000.0, None)):
        ev += [runtime("cudaLaunchKernel", t, 3.0, corr=corr), kernel("work_kernel", t + 5.0, 500.0, 0, corr)]
        if op:
            ev.append(cpu_op(op, t + 600.0, idle_us - 200.0, 0))
        t += 505.0 + idle_us
        corr += 1
    ev += [runtime("cudaLaunchKernel", t, 3.0, corr=corr), kernel("work_kernel", t + 5.0, 500.0, 0, corr)]
    check(
        analyse([write_trace(tmp_path / "gaps.json", ev)]),
        [
            Expect(
                "PR504",
                key="gaps",
                evidence={"gap_count": 4, "gaps.0.host": "host in my_preprocess"},
                says=[r"the largest: host in my_preprocess"],
            )
        ],
    )


def test_frees_in_every_step_are_the_allocator_not_start_up(tmp_path):
    # Construction (TraceLens's MI300X DDP ResNet-18 trace without a memory pool: 1,360 hipFree calls, up to 70 ms,
    # spread over the whole run): 24 steps of 1 ms of kernels, each followed by a 5 ms cudaFree with nothing else
    # on the host. Calls that keep coming after half of the GPU work has run (12 here, half their time) are
    # steady-state host work, not one-time set-up: no start-up finding, the gaps name the free, and the advice is
    # the caching allocator's.
    ev, corr, t = [], 10, 0.0
    for _ in range(24):
        ev += [runtime("cudaLaunchKernel", t, 3.0, corr=corr), kernel("work_kernel", t + 5.0, 995.0, 0, corr)]
        ev.append(runtime("cudaFree", t + 1_001.0, 5_000.0))
        t += 6_010.0
        corr += 1
    ev += [runtime("cudaLaunchKernel", t, 3.0, corr=corr), kernel("work_kernel", t + 5.0, 995.0, 0, corr)]
    v = analyse([write_trace(tmp_path / "frees.json", ev)])
    assert not [f for f in v["findings"] if f["rule"] == "PR504" and f["key"] == "startup"]
    assert "startup" not in {x["category"] for x in v["losses"]}
    check(
        v,
        [
            Expect(
                "PR504",
                key="gaps",
                evidence={"gap_count": 24, "gaps.0.host_call": "cudaFree"},
                says=[r"in cudaFree for", r"caching allocator"],
                never_says=[r"one-time", r"warm-up"],
            )
        ],
    )


def test_a_small_named_gap_is_not_said_beside_a_large_untraced_one(tmp_path):
    # The shape of the kineto repo's ResNet50 sample (V100): an 80 ms idle tail with nothing traced on the host, and
    # a 1.1 ms gap in aten::batch_norm. The fix said "a 1.12 ms one: host in aten::batch_norm", reading as the cause
    # of the 82 ms; most of the idle time has no traced host work, and the fix says so.
    ev = [runtime("cudaLaunchKernel", 0.0, 3.0, corr=10), kernel("work_kernel", 5.0, 500.0, 0, 10)]
    ev += [cpu_op("aten::batch_norm", 600.0, 1_000.0, 0), runtime("cudaLaunchKernel", 1_600.0, 3.0, corr=11)]
    ev += [kernel("work_kernel", 1_605.0, 500.0, 0, 11), runtime("cudaLaunchKernel", 82_100.0, 3.0, corr=12)]
    ev += [kernel("work_kernel", 82_105.0, 500.0, 0, 12)]
    v = analyse([write_trace(tmp_path / "tail.json", ev)])
    (f,) = [x for x in v["findings"] if x["rule"] == "PR504"]
    assert f["evidence"]["gap_count"] == 2 and f["evidence"]["gaps"][0]["host"] == "nothing traced on the host"
    assert "most with nothing traced on the host" in f["fix"] and "batch_norm" not in f["fix"], f["fix"]


def test_frees_after_the_last_kernel_are_teardown(tmp_path):
    # Construction (pipit's cloverleaf export ends so: 7 ms in cudaFree after its last kernel, said as "the host sets
    # up"): a cudaMalloc 0–3,000 µs, a launch and its 100 µs kernel at 3,010 µs, then cudaFree 3,200–8,200 µs. Both
    # gaps are one-time; the one after the last kernel (3,110–8,200 µs) is said to be the program tearing down.
    ev = [runtime("cudaMalloc", 0.0, 3000.0), runtime("cudaLaunchKernel", 3002.0, 3.0, corr=1)]
    ev += [kernel("work_kernel", 3010.0, 100.0, 0, 1), runtime("cudaFree", 3200.0, 5000.0)]
    v = analyse([write_trace(tmp_path / "teardown.json", ev)])
    (f,) = [x for x in v["findings"] if x["rule"] == "PR504" and x["category"] == "startup"]
    assert "5.09 ms of it (1 gap) comes after the GPU's last activity" in f["recommendation"], f["recommendation"]


def _linear_calls(tmp_path, first_us: float, later_us: float) -> dict:
    # Construction (the shape of TraceLens's B200 vLLM eager trace: each linear's first aten::addmm with a new shape
    # spends 1.5-2.5 ms on the host before it launches, its 35 later calls 41-80 µs): a 100 µs kernel, then four
    # aten::linear → aten::addmm calls of the same shapes, back to back from 200 µs. Each addmm spends its time on
    # the host and launches its 100 µs GEMM at its end; the first takes `first_us`, the others `later_us`.
    dims = [[512], [64, 256], [256, 512], [], []]
    ev = [runtime("cudaLaunchKernel", 1.0, 2.0, corr=1), kernel("warm_kernel", 5.0, 100.0, 0, 1)]
    t0 = 200.0
    for k in range(4):
        host = first_us if k == 0 else later_us
        if k:
            t0 += (first_us if k == 1 else later_us) + 20.0
        ev += [
            cpu_op("aten::linear", t0, host + 10.0, ext=10 + k, dims=dims),
            cpu_op("aten::addmm", t0 + 2.0, host + 6.0, ext=20 + k, dims=dims),
            runtime("cudaLaunchKernel", t0 + 2.0 + host, 3.0, corr=30 + k),
            kernel("gemm_kernel", t0 + 10.0 + host, 100.0, 0, 30 + k),
        ]
    v = analyse([write_trace(tmp_path / f"first{first_us:.0f}_{later_us:.0f}.json", ev)], write_html=False, write_trace=False)
    (f,) = [x for x in v["findings"] if x["rule"] == "PR504" and x["key"] == "gaps"]
    return f


def test_an_ops_first_call_with_new_shapes_is_named_as_one(tmp_path):
    # The first addmm takes 2,500 µs, the three later ones 50 µs (median 50 µs: 50× faster). The first gap (100 →
    # ~2,710 µs) is under aten::linear → aten::addmm, its first call: said so with both times, and the advice is to
    # warm up, not to move host work off the step.
    f = _linear_calls(tmp_path, 2500.0, 50.0)
    big = f["evidence"]["gaps"][0]
    assert big["first_call"] == "aten::addmm" and big["host_ops"] == ["aten::linear → aten::addmm"], big
    # (each addmm lasts its host time + 6 µs: 2,506 µs first, 56 µs the later three)
    assert "its first call with these shapes (2.51 ms; 3 later: 56.0 µs median)" in big["host"], big["host"]
    assert "first calls with new shapes" in f["fix"] and "warm up every batch" in f["recommendation"]
    assert "Keep work queued while the host is busy" not in f["recommendation"]


def test_a_slow_op_every_time_is_not_a_first_call(tmp_path):
    # The same ops, every call 2,500 µs on the host: a steady host cost, not a first call's.
    f = _linear_calls(tmp_path, 2500.0, 2500.0)
    assert f["evidence"]["gaps"] and not [g for g in f["evidence"]["gaps"] if g["first_call"]], f["evidence"]["gaps"]
    assert "first call" not in f["recommendation"] and "Keep work queued while the host is busy" in f["recommendation"]


def _partly_traced(tmp_path, recv_us: float, phase_us: float = 0.0) -> str:
    # Construction (the shape of pipit's saxpy-mpi nsys export on Perlmutter: 172-196 ms gaps of which MPI_Recv and
    # MPI_Send ranges cover 20-30%, read as "nothing traced on the host"): a 100 µs kernel, then a `recv` range of
    # `recv_us` from 1,000 µs, then the next kernel launched at 4,990 µs and run at 5,000 µs: a 4,900 µs gap.
    ev = [runtime("cudaLaunchKernel", 1.0, 2.0, corr=1), kernel("work_kernel", 0.0, 100.0, 0, 1)]
    ev += [annotation("recv", 1000.0, recv_us)]
    if phase_us:  # a range longer than the gap that begins in it (an optimizer step, a phase)
        ev += [annotation("phase", 200.0, phase_us)]
    # (the second kernel runs to the phase's end: no idle tail)
    ev += [runtime("cudaLaunchKernel", 4990.0, 3.0, corr=2), kernel("work_kernel", 5000.0, max(100.0, phase_us - 4700.0), 0, 2)]
    v = analyse([write_trace(tmp_path / f"mpi{recv_us:.0f}.json", ev)], write_html=False, write_trace=False)
    (f,) = [x for x in v["findings"] if x["rule"] == "PR504" and x["key"] == "gaps"]
    return f["evidence"]["gaps"][0]["host"]


def test_a_range_over_part_of_a_gap_is_named_for_that_part(tmp_path):
    # 1,470 µs of the 4,900 µs gap (30%) in `recv`: named, with its share, and the rest said to be untraced
    assert _partly_traced(tmp_path, 1470.0) == "host in range recv for 30% of it, the rest not traced"
    # 245 µs (5%, under PARTIAL_SHARE): nothing worth naming
    assert _partly_traced(tmp_path, 245.0) == "nothing traced on the host"
    # a 12 ms `phase` from 200 µs covers 98% of the gap but is 2.4× longer: where it happened, not what the host did
    # (TraceLens's xDiT traces: "host in range execute_diffusion_1_256x256 for 97% of it")
    assert _partly_traced(tmp_path, 245.0, phase_us=12_000.0) == "nothing traced on the host"


def test_a_kernel_queued_behind_a_stream_wait_names_it_and_is_no_first_call(tmp_path):
    # Construction (the shape of TraceLens's SGLang prefill+decode MI300X trace: hipStreamWaitEvent 18 µs into a
    # 493 ms gap, a kernel launched, then aten::to → aten::copy_ blocked in hipMemcpyWithStream until the queued kernel
    # ran; copy_'s 6 later calls took 8 µs): a 100 µs kernel; cudaStreamWaitEvent at 110 µs; kernel 2 launched at
    # 150 µs, run at 5,000 µs; meanwhile aten::copy_ (shapes [[8]]) on the host from 160 to 5,000 µs in a
    # cudaMemcpy; three later copy_ calls of 10 µs. The gap is a wait behind the event, not copy_'s first call.
    ev = [runtime("cudaLaunchKernel", 1.0, 2.0, corr=1), kernel("work_kernel", 0.0, 100.0, 0, 1)]
    ev += [runtime("cudaStreamWaitEvent", 110.0, 5.0, corr=90), runtime("cudaLaunchKernel", 150.0, 3.0, corr=2)]
    ev += [cpu_op("aten::copy_", 160.0, 4845.0, ext=5, dims=[[8]]), runtime("cudaMemcpy", 165.0, 4835.0, corr=91)]
    ev += [kernel("work_kernel", 5000.0, 100.0, 0, 2)]
    for k in range(3):
        ev += [cpu_op("aten::copy_", 5200.0 + 100.0 * k, 10.0, ext=6 + k, dims=[[8]])]
    v = analyse([write_trace(tmp_path / "wait.json", ev)], write_html=False, write_trace=False)
    (f,) = [x for x in v["findings"] if x["rule"] == "PR504" and x["key"] == "gaps"]
    (g,) = f["evidence"]["gaps"]
    assert "behind a cudaStreamWaitEvent: the GPU waited on work the trace does not hold" in g["host"], g["host"]
    assert g["first_call"] is None and "first call" not in g["host"]
    # (one gap: "1 gap … leaves", "In it", not "In most of them")
    assert "1 gap of at least 1 ms leaves" in f["recommendation"] and "In it the next kernel" in f["recommendation"]
    # (a CUDA trace's advice names CUDA's call, not HIP's)
    assert "(cudaStreamWaitEvent)" in f["recommendation"] and "hip" not in f["recommendation"]


def test_an_annotation_is_not_named_as_the_op_under_a_gap(tmp_path):
    # Construction (the shape of kineto's ResNet-50 sample with 4 DataLoader workers): a 10 ms gap between two
    # kernels. On thread 1, `ProfilerStep#1` (an annotation) sits under `## step ##` and spans the gap; on thread
    # 2, `aten::to` alone spans it. The op the host was in is aten::to; the step marker is no op to name, however
    # deep it is nested.
    ev = [
        runtime("cudaLaunchKernel", 1.0, 3.0, corr=1),
        kernel("work_kernel", 5.0, 100.0, 0, 1),
        annotation("## step ##", 0.0, 11_000.0),
        cpu_op("ProfilerStep#1", 50.0, 10_800.0, 0),
        cpu_op("aten::to", 110.0, 10_000.0, 0, tid=2),
        runtime("cudaLaunchKernel", 10_200.0, 3.0, corr=2),
        kernel("work_kernel", 10_205.0, 100.0, 0, 2),
    ]
    f = [x for x in analyse([write_trace(tmp_path / "step.json", ev)])["findings"] if x["rule"] == "PR504" and x["key"] == "gaps"]
    assert f, "no PR504 gap finding"
    (gap,) = f[0]["evidence"]["gaps"]
    assert gap["host_ops"] == ["aten::to"], gap
    assert "ProfilerStep" not in f[0]["recommendation"], f[0]["recommendation"]
