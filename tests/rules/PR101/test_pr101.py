"""PR101 straggler-rank: fires on a rank that reaches collectives late (synthetic, and the committed DDP sample
whose rank 1 sleeps 30 ms before every backward), says start-up skew when only the first collective is late, and is
silent when the ranks are punctual or there is one rank."""

from __future__ import annotations

from ..expect import Expect, Near, analyse, check, ddp_sample, single_phase, truth
from ..traces import allreduce_traces


def test_fires_on_a_late_rank(tmp_path):
    # Construction: rank 1's mm runs 300 µs longer before each of 3 all-reduces, which end together, so rank 0
    # waits 300 µs in each: 900 µs of collective wait over 2 ranks × 3 × 1300 µs windows = 0.1154.
    v = analyse(allreduce_traces(tmp_path, skew_us=300.0))
    check(
        v,
        [
            Expect(
                "PR101",
                rank=1,
                category="collective_wait",
                lost_fraction=Near(900 / 7800, abs=0.005, truth="construction: 3 × 300 µs of 7800 µs"),
                evidence={
                    "mean_lateness_ns": Near(300e3, rel=0.02, truth="construction: 300 µs skew"),
                    "collectives_late": 3,
                    "collectives_total": 3,
                    "late_share": 1.0,
                    "startup_skew": False,
                    "waiting_ranks.0.rank": 0,
                    "waiting_ranks.0.wait_ns": Near(900e3, rel=0.02, truth="construction"),
                },
            )
        ],
    )


def test_fires_on_the_ddp_sample():
    # sample_traces/h200x2_ddp/ground_truth.json: rank 1 sleeps 30 ms before each backward (5 profiled steps), so
    # rank 0 waits ~30 ms in the first all-reduce of every step.
    t = truth("h200x2_ddp/ground_truth.json")
    late_ns = t["late_sleep_s"] * 1e9
    check(
        ddp_sample(),
        [
            Expect(
                "PR101",
                rank=t["late_rank"],
                category="collective_wait",
                evidence={
                    "late_share": 1.0,
                    "collectives": ["allreduce"],
                    "startup_skew": False,
                    "steps_seen": t["profiled_steps"],
                    "lateness_per_step_ns": Near(late_ns, rel=0.2, truth="ground_truth.json late_sleep_s"),
                    "waiting_ranks.0.rank": 1 - t["late_rank"],
                    "wait_caused_per_step_ns": Near(late_ns, rel=0.2, truth="ground_truth.json late_sleep_s"),
                },
            )
        ],
    )


def test_start_up_skew_is_named(tmp_path):
    # Construction: rank 1 is 50 ms late to the first all-reduce only; the next two are punctual.
    v = analyse(allreduce_traces(tmp_path, first_only_us=50_000.0))
    check(
        v,
        [
            Expect(
                "PR101",
                rank=1,
                evidence={
                    "startup_skew": True,
                    "collectives_late": 1,
                    "max_lateness_ns": Near(50e6, rel=0.01, truth="construction"),
                },
                says=[r"start-up skew"],
                never_says=[r"balance the work"],
            )
        ],
    )


def test_silent_when_punctual_or_alone(tmp_path):
    check(analyse(allreduce_traces(tmp_path, skew_us=0.0)), [], silent=["PR101"])
    check(single_phase("train_step"), [], silent=["PR101"])  # one rank, no collectives
