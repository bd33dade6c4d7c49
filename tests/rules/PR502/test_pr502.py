"""PR502 host-sync-stall: fires on the committed host-stall phase (.item() then a 20 ms sleep, five times), says a
sync seen once is once (and, before the work, the set-up wait it is) in the program's own words; silent where the
GPU never waits on a sync."""

from __future__ import annotations

from ...conftest import annotation, cpu_op, kernel, write_trace
from ..expect import Expect, Near, analyse, check, single_phase, truth
from ..traces import runtime


def test_fires_on_item_in_the_loop():
    # kineto_run_info.json: 5 × (1024³ mm, c[0, 0].item(), time.sleep(0.020)): the GPU idles ~20 ms after each sync.
    # Each .item() waits only for its ~20 µs mm (ground_truth.json: the phase's 5 kernels take 0.028 ms), so what
    # keeps the GPU idle is the 20 ms sleep after it: dropping the sync would recover at most its wait, and the
    # advice says so instead of "take it out of the hot loop" (without the sync the sleep still idles the GPU).
    cfg = truth("h200_single/kineto_run_info.json")["config"]
    check(
        single_phase("host_stall"),
        [
            Expect(
                "PR502",
                category="sync_stall",
                evidence={
                    "as_written": ".item()",
                    "sync_call": "cudaStreamSynchronize",
                    "op": "aten::_local_scalar_dense",
                    "outer_op": "aten::item",
                    "syncs": cfg["stall_iters"],
                    "once": False,
                    "d2h_copies": lambda n: n and n >= cfg["stall_iters"],
                    "mean_idle_ns": Near(cfg["stall_sleep"] * 1e9, rel=0.1, truth="the 20 ms sleep after each sync"),
                    "mean_wait_ns": lambda w: w is not None and w < 0.01 * cfg["stall_sleep"] * 1e9,
                },
                says=[r"waited only", r"recovers at most its wait", r"host"],
                never_says=[r"hot loop"],
            )
        ],
    )


def _one_sync(tmp_path, work_before_us: float):
    # Construction: a CUDA program: `work_before_us` of kernels, one cudaStreamSynchronize that returns as the GPU
    # drains, then 200 ms with nothing launched, then 10 ms of kernels (20 × 500 µs).
    ev, corr, t = [], 100, 0.0
    while t < work_before_us:
        ev += [runtime("cudaLaunchKernel", t, 3.0, corr=corr), kernel("work_kernel", t + 5.0, 100.0, 0, corr)]
        t += 105.0
        corr += 1
    ev.append(runtime("cudaStreamSynchronize", t, 6.0, corr=corr))
    t += 200_000.0
    for i in range(20):
        ev += [
            runtime("cudaLaunchKernel", t + i * 500.0, 3.0, corr=corr + 1 + i),
            kernel("work_kernel", t + 5.0 + i * 500.0, 495.0, 0, corr + 1 + i),
        ]
    return analyse([write_trace(tmp_path / "sync.json", ev)])


def test_a_single_sync_before_the_work_is_set_up(tmp_path):
    # 0.1 ms of work before the sync, 10 ms after: ≥ 99% of the GPU work comes after the wait.
    check(
        _one_sync(tmp_path, 100.0),
        [
            Expect(
                "PR502",
                evidence={
                    "syncs": 1,
                    "once": True,
                    "before_the_work": True,
                    "sync_call": "cudaStreamSynchronize",
                    "as_written": "cudaStreamSynchronize",
                    "mean_idle_ns": Near(200e6, rel=0.01, truth="construction: 200 ms"),
                },
                says=[r"once", r"set-up"],
                never_says=[r"from the loop", r"\beach\b", r"torch", r"\.item\(\)", r"hot loop"],
            )
        ],
    )


def test_a_single_sync_mid_work_is_once_not_the_loop(tmp_path):
    # 10 ms of work before the sync and 10 ms after: half the work comes after — not set-up, not known to recur.
    check(
        _one_sync(tmp_path, 10_000.0),
        [
            Expect(
                "PR502",
                evidence={
                    "syncs": 1,
                    "once": True,
                    "before_the_work": False,
                    "gpu_work_after_share": Near(0.5, abs=0.02, truth="construction: 10 ms of 20 ms"),
                },
                says=[r"once"],
                never_says=[r"from the loop", r"\beach\b", r"torch"],
            )
        ],
    )


def test_silent_without_sync_stalls(tmp_path):
    # the compute-bound phase ends with one torch.cuda.synchronize() whose ~0.1 ms of idle is below the 1% threshold
    check(single_phase("compute_bound"), [], silent=["PR502"])
    # Construction: kernels back to back, no sync at all.
    ev, t = [], 0.0
    for i in range(20):
        ev += [runtime("cudaLaunchKernel", t, 3.0, corr=10 + i), kernel("work_kernel", t + 5.0, 100.0, 0, 10 + i)]
        t += 101.0
    check(analyse([write_trace(tmp_path / "nosync.json", ev)]), [], silent=["PR502"])


def test_the_sync_is_named_by_its_own_thread_not_a_busier_one(tmp_path):
    """The ops around a sync are those of its thread (a range join on the times, the thread a filter: see
    `context.residual`), never a deeper stack another thread has open meanwhile. Construction: thread 1 runs
    aten::item → aten::_local_scalar_dense → cudaStreamSynchronize, then nothing is launched for 200 ms; thread 2
    holds four nested ops open across the whole sync (deeper than thread 1's two)."""
    ev = [
        runtime("cudaLaunchKernel", 0.0, 3.0, corr=100),
        kernel("work_kernel", 5.0, 1_000.0, 0, 100),
        cpu_op("aten::item", 900.0, 200.0, 0, tid=1),
        cpu_op("aten::_local_scalar_dense", 905.0, 190.0, 0, tid=1),
        runtime("cudaStreamSynchronize", 910.0, 100.0, corr=101, tid=1),
    ]
    ev += [cpu_op(f"aten::other_thread_{d}", 800.0 + d, 400.0 - 2 * d, 0, tid=2) for d in range(4)]
    t = 201_000.0
    for i in range(20):
        ev += [
            runtime("cudaLaunchKernel", t + i * 500.0, 3.0, corr=102 + i),
            kernel("work_kernel", t + 5.0 + i * 500.0, 495.0, 0, 102 + i),
        ]
    check(
        analyse([write_trace(tmp_path / "threads.json", ev)]),
        [
            Expect(
                "PR502",
                evidence={"op": "aten::_local_scalar_dense", "outer_op": "aten::item", "as_written": ".item()"},
                never_says=[r"other_thread"],
            )
        ],
    )


def test_one_site_synced_in_several_ranges_says_so(tmp_path):
    # Construction: the same cudaStreamSynchronize, called inside range `fwd` three times and inside `bwd` once;
    # each returns as the GPU drains and the host then launches nothing for 10 ms (`fwd`) or 5 ms (`bwd`). One
    # finding (one call site) whose syncs lie in two ranges: both said, the costlier (`fwd`, 30 of 35 ms) named.
    ev, corr, t = [], 100, 0.0
    for name, idle_us in (("fwd", 10_000.0), ("fwd", 10_000.0), ("bwd", 5_000.0), ("fwd", 10_000.0)):
        ev += [runtime("cudaLaunchKernel", t, 3.0, corr=corr), kernel("work_kernel", t + 5.0, 500.0, 0, corr)]
        ev += [annotation(name, t + 10.0, 500.0), runtime("cudaStreamSynchronize", t + 20.0, 486.0, corr=corr + 1)]
        t += 505.0 + idle_us
        corr += 2
    ev += [runtime("cudaLaunchKernel", t, 3.0, corr=corr), kernel("work_kernel", t + 5.0, 500.0, 0, corr)]
    check(
        analyse([write_trace(tmp_path / "ranges.json", ev)]),
        [
            Expect(
                "PR502",
                evidence={"syncs": 4, "range": "fwd", "ranges": ["bwd", "fwd"]},
                says=[r"2 ranges", r"fwd"],
            )
        ],
    )


def test_a_blocking_hip_copy_is_a_sync(tmp_path):
    # Construction (PyTorch on ROCm: `.item()` / `.cpu()` copy through hipMemcpyWithStream, which blocks the host):
    # 1 ms of kernels, the blocking copy returns as the GPU drains, then 20 ms with nothing launched, then 1 ms of
    # kernels. The 20 ms gap began as a sync returned: sync_stall, PR502 naming the call.
    ev, corr, t = [], 100, 0.0
    for _ in range(2):
        ev += [runtime("hipLaunchKernel", t, 3.0, corr=corr), kernel("work_kernel", t + 5.0, 995.0, 0, corr)]
        corr += 1
        t += 1_000.0
    ev.append(runtime("hipMemcpyWithStream", 1_010.0, 1_000.0, corr=corr))
    t = 22_000.0
    ev += [runtime("hipLaunchKernel", t, 3.0, corr=corr + 1), kernel("work_kernel", t + 5.0, 995.0, 0, corr + 1)]
    v = analyse([write_trace(tmp_path / "hip.json", ev, gpu="AMD Instinct MI300X")])
    assert v["losses"][0]["category"] == "sync_stall"
    check(v, [Expect("PR502", evidence={"sync_call": "hipMemcpyWithStream", "syncs": 1})])


def test_one_long_gap_among_alike_ones_is_said_as_the_worst(tmp_path):
    # Construction: a CUDA program, 4 × (a 100 µs kernel, a cudaStreamSynchronize blocking on it, then the host
    # idles the GPU 1, 1, 1 and 20 ms before the next kernel). Mean 5.75 ms is no gap's length: the fix says the
    # worst (20 ms) rather than "5.75 ms idle each" (the corpus H200 nsys export: "10×, 50.5 ms idle each" of nine
    # 20 ms gaps and one of 321 ms).
    ev, t, corr = [], 0.0, 100
    for idle_us in (1000.0, 1000.0, 1000.0, 20_000.0):
        ev += [runtime("cudaLaunchKernel", t, 3.0, corr=corr), kernel("work_kernel", t + 5.0, 100.0, 0, corr)]
        ev.append(runtime("cudaStreamSynchronize", t + 4.0, 102.0, corr=corr + 1))
        t += 105.0 + idle_us
        corr += 2
    ev += [runtime("cudaLaunchKernel", t, 3.0, corr=corr), kernel("work_kernel", t + 5.0, 100.0, 0, corr)]
    v = analyse([write_trace(tmp_path / "spread.json", ev)])
    (f,) = [x for x in v["findings"] if x["rule"] == "PR502"]
    assert "worst 20.0 ms" in f["fix"] and " each" not in f["fix"], f["fix"]
