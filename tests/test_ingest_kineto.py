"""Kineto ingest: every table filled correctly from real traces; times by SPEC §3; links op → launch → kernel."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import pytest

from plasmient_report import pipeline, store
from plasmient_report.errors import BadInput

from .conftest import CORPUS, SAMPLES, corpus_file, kernel, sample_file, write_trace


def ingest(*paths: Path):
    con = store.connect()
    pipeline.ingest(con, list(paths))
    return con


def test_single_h200_trace_tables_match_the_json():
    path = corpus_file("h200-single-kineto/kineto_single.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    con = ingest(path)
    counts = dict(con.execute("SELECT kind, count(*) FROM kernels GROUP BY kind").fetchall())
    assert counts["memcpy"] == sum(e["cat"] == "gpu_memcpy" for e in ev)
    assert counts["memset"] == sum(e["cat"] == "gpu_memset" for e in ev)
    assert counts["compute"] == sum(e["cat"] == "kernel" for e in ev)
    assert con.execute("SELECT count(*) FROM ops").fetchone()[0] == sum(e["cat"] == "cpu_op" for e in ev)
    assert con.execute("SELECT count(*) FROM api_calls").fetchone()[0] == sum(
        e["cat"] in ("cuda_runtime", "cuda_driver") for e in ev
    )
    # SPEC §3: utc_ns = baseTimeNanoseconds + round(ts·1000), exact to the ns.
    first = min((e for e in ev if e["cat"] == "kernel"), key=lambda e: e["ts"])
    got = con.execute("SELECT min(start_ns) FROM kernels WHERE kind = 'compute'").fetchone()[0]
    assert got == doc["baseTimeNanoseconds"] + round(first["ts"] * 1000)
    # Device properties land in `devices`.
    assert con.execute("SELECT name, sm_count FROM devices").fetchall() == [("NVIDIA H200", 132)]
    # Ranges: CPU-side phase annotations, and the GPU copies flagged on_gpu.
    phases = {n for (n,) in con.execute("SELECT name FROM ranges WHERE NOT on_gpu AND name LIKE 'phase:%'").fetchall()}
    assert phases == {f"phase:{p}" for p in ("compute_bound", "memory_bound", "launch_bound", "host_stall", "train_step")}


def test_every_kernel_links_to_its_launch_and_op():
    con = ingest(corpus_file("h200-single-kineto/kineto_single.json.gz"))
    from plasmient_report import metrics

    metrics.model_op_flops(con)
    metrics.nest_ops(con)
    metrics.attribute_kernel_flops(con)
    unlinked = con.execute("""
        SELECT count(*) FROM kernels k WHERE kind = 'compute' AND NOT EXISTS (
            SELECT 1 FROM api_calls a WHERE a.source_id = k.source_id AND a.correlation = k.correlation)""").fetchone()[0]
    assert unlinked == 0
    # The 8192³ mm kernels belong to aten::mm ops (External id link).
    rows = con.execute("""
        SELECT o.name, count(*) FROM kernels k JOIN ops o ON o.op_id = k.op_id
        WHERE k.name LIKE 'nvjet%' GROUP BY o.name""").fetchall()
    assert dict(rows).get("aten::mm", 0) >= 30
    # Nesting: every aten::mm in the compute phase sits inside something or is top level, depth >= 0.
    assert con.execute("SELECT count(*) FROM ops WHERE depth IS NULL").fetchone()[0] == 0


def test_nccl_collectives_from_two_ranks():
    d = corpus_file("h200x2-small/kineto")
    con = ingest(d)
    assert sorted(r for (r,) in con.execute("SELECT DISTINCT rank FROM kernels").fetchall()) == [0, 1]
    rows = con.execute("""SELECT rank, collective, count(*), min(group_ranks), min(bytes) FROM collectives
                          GROUP BY ALL ORDER BY ALL""").fetchall()
    by = {(r, c): (n, g, b) for r, c, n, g, b in rows}
    assert by[(0, "allreduce")][0] == by[(1, "allreduce")][0] >= 3
    assert by[(0, "allreduce")][1] == "[0, 1]"
    assert by[(0, "allreduce")][2] == 4194304 * 2  # 2048² bf16 elements
    # Sequence numbers pair the same collective across ranks.
    seqs = con.execute("""SELECT rank, list(seq ORDER BY start_ns) FROM collectives WHERE collective = 'allreduce'
                          GROUP BY rank ORDER BY rank""").fetchall()
    assert seqs[0][1] == seqs[1][1] == list(range(len(seqs[0][1])))


@pytest.mark.parametrize(
    "name",
    [
        "alexnet__benchmark_result_2869224_1695835535_trace.json.gz",  # 2023, epoch-µs ts, cuda_sync
        "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",  # ROCm
        "nccl_parser_config__nccl_data.json.gz",
        "ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
        "trace_diff__test__test.json.gz",  # 2022 format
        "trace_filter__sampled_rank-0.json.gz",
        "trace_filter__sampled_rank-1.json.gz",
        "triton_example__triton_example.json.gz",  # args of unexpected types (grid as text)
    ],
)
def test_public_kineto_traces_ingest(name):
    path = corpus_file(f"public-kineto-hta/{name}")
    con = ingest(path)
    n, lo, hi = con.execute("SELECT count(*), min(start_ns), max(end_ns) FROM kernels").fetchone()
    assert n > 0
    # Every trace here was recorded between 2020 and 2027: times must be UTC epoch ns.
    assert 1.58e18 < lo < hi < 1.83e18


def test_epoch_us_trace_without_base(tmp_path):
    ts = 1_695_835_542_481_129.0  # epoch µs (2023), as old traces write it
    p = write_trace(tmp_path / "old.json", [kernel("k", ts, 10.0, 1, 1)], base=None)
    con = ingest(p)
    assert con.execute("SELECT start_ns, end_ns FROM kernels").fetchone() == (
        1_695_835_542_481_129_000,
        1_695_835_542_481_139_000,
    )
    assert con.execute("SELECT clock_anchor FROM sources").fetchone()[0] == "epoch_us"


def test_cpu_only_trace_is_refused_with_one_line():
    with pytest.raises(BadInput, match="no GPU kernels"):
        ingest(corpus_file("public-kineto-hta/cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"))


def test_corpus_dir_exists_or_skip():
    if not CORPUS.exists():
        pytest.skip("../shared/corpus not present")
    assert (CORPUS / "FORMATS.md").exists()


# ------------------------------------------------------------------ traces from other systems (issue 14)


def _events(path: Path) -> list[dict]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def test_torch_1_9_trace_reads_every_gpu_event():
    """torch 1.9-era profiler (capitalised categories, `external id`, no baseTimeNanoseconds): every GPU event is
    read, times are epoch µs (SPEC §3), ops link to their kernels. Truth: the JSON itself, counted here."""
    path = corpus_file("public-real/kineto-resnet50-nw0/worker0.1623143089861.pt.trace.json.gz")
    ev = [e for e in _events(path) if e.get("ph") == "X"]
    by_cat = {c: sum(e.get("cat") == c for e in ev) for c in ("Kernel", "Memcpy", "Memset", "Runtime", "Operator")}
    assert by_cat["Kernel"] == 8772  # the count issue 14 names
    con = ingest(path)
    counts = dict(con.execute("SELECT kind, count(*) FROM kernels GROUP BY kind").fetchall())
    assert counts.get("compute", 0) + counts.get("nccl", 0) == by_cat["Kernel"]
    assert counts["memcpy"] == by_cat["Memcpy"] and counts["memset"] == by_cat["Memset"]
    assert con.execute("SELECT count(*) FROM api_calls").fetchone()[0] == by_cat["Runtime"]
    assert con.execute("SELECT count(*) FROM ops").fetchone()[0] == by_cat["Operator"]
    first = min((e for e in ev if e["cat"] == "Kernel"), key=lambda e: e["ts"])
    assert con.execute("SELECT min(start_ns) FROM kernels WHERE kind <> 'memcpy' AND kind <> 'memset'").fetchone()[0] == round(
        first["ts"] * 1000
    )
    assert con.execute("SELECT clock_anchor FROM sources").fetchone()[0] == "epoch_us"
    # `external id` (lower case) on kernels is the op's External id: kernels carry it
    linked = con.execute("SELECT count(*) FROM kernels WHERE external_id IS NOT NULL AND kind = 'compute'").fetchone()[0]
    assert linked == sum(1 for e in ev if e["cat"] == "Kernel" and "external id" in e.get("args", {}))
    assert con.execute("SELECT name FROM devices").fetchall() == [("Tesla V100-DGXS-32GB",)]


def test_rocm_kernels_on_a_device_id_that_is_no_entry_index():
    """ROCm: kernels on device 2 with one deviceProperties entry of id 0 — that entry describes them."""
    path = corpus_file("public-real/tl-mi300-compile-triton/trace.json.gz")
    ev = _events(path)
    devs = {e["args"]["device"] for e in ev if e.get("cat") == "kernel"}
    assert devs == {2}
    con = ingest(path)
    assert con.execute("SELECT device, name, sm_count FROM devices").fetchall() == [(2, "AMD Instinct MI300X", 304)]
    notes = con.execute("SELECT notes FROM sources").fetchone()[0]
    assert "device 2 described by the one deviceProperties entry (id 0)" in notes


def test_gpu_named_generically_is_identified_from_its_properties():
    """HIP names an MI250 GCD 'AMD Radeon Graphics' (gfx90a = 9.0, 104 CUs, 64 GiB): identified, and said."""
    path = corpus_file("public-kineto-hta/amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    con = ingest(path)
    ((name,),) = con.execute("SELECT DISTINCT name FROM devices").fetchall()
    assert name == "AMD Instinct MI250 (one GCD)"
    notes = con.execute("SELECT notes FROM sources").fetchone()[0]
    assert "named 'AMD Radeon Graphics' in the trace" in notes and "MI210" in notes  # same figures: both said


def test_gpu_with_no_name_is_identified_from_its_properties(tmp_path):
    # Properties of a real MI300X entry (TraceLens vllm trace: name '', 304 CUs, 9.4, 206141652992 B).
    p = tmp_path / "t.json"
    doc = {
        "deviceProperties": [
            {
                "id": 0,
                "name": "",
                "totalGlobalMem": 206141652992,
                "computeMajor": 9,
                "computeMinor": 4,
                "numSms": 304,
                "warpSize": 64,
            }
        ],
        "baseTimeNanoseconds": 1_767_189_312_000_000_000,
        "traceEvents": [kernel("k", 10.0, 5.0, 1, 1, device=2)],
    }
    p.write_text(json.dumps(doc))
    con = ingest(p)
    assert con.execute("SELECT device, name FROM devices").fetchall() == [(2, "AMD Instinct MI300X")]
    assert "identified as AMD Instinct MI300X from its properties" in con.execute("SELECT notes FROM sources").fetchone()[0]
    # the peak rests on that identification: the verdict says it too, with the device it is about
    res = pipeline.analyse([p], pipeline.Options(write_html=False, write_trace=False))
    try:
        said = [n for n in res.verdict["notes"] if "from its properties" in n]
        assert said == [
            "device 2: GPU not named in the trace, identified as AMD Instinct MI300X from its properties "
            "(compute capability 9.4, 304 CUs, 192 GiB)"
        ]
    finally:
        res.close()


def test_gpus_under_the_first_name_of_the_properties_block(tmp_path):
    # Kineto of early 2021 (torch 1.8) wrote the block as `computeProperties` (kineto's tb_plugin test trace
    # gpu_metrics_input.json: four of these V100 entries): read as deviceProperties is.
    entry = {"name": "Tesla V100-DGXS-32GB", "totalGlobalMem": 34087305216, "major": 7, "minor": 0, "multiProcessorCount": 80}
    p = tmp_path / "t.json"
    doc = {
        "schemaVersion": 1,
        "computeProperties": [{"id": i, **entry} for i in range(4)],
        "traceEvents": [kernel("k", 10.0, 5.0, 1, 1, device=1)],
    }
    p.write_text(json.dumps(doc))
    con = ingest(p)
    assert con.execute("SELECT device, name, sm_count FROM devices").fetchall() == [(1, "Tesla V100-DGXS-32GB", 80)]


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        (
            {
                "traceEvents": [
                    {"ph": "X", "cat": "mtia_ccp_events", "name": "k", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0},
                    {"ph": "X", "cat": "mtia_runtime", "name": "r", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0},
                ]
            },
            "MTIA accelerator trace",
        ),
        ({"rocprofiler-sdk-tool": [{"metadata": {"node": {"id": 0}}}]}, "rocprofiler-sdk"),
        ({"schema": "1.0.2-chakra.0.0.4", "pid": 1, "time": "x", "nodes": [{"id": 1}]}, "execution trace"),
        (  # the CUPTI profiler's counter mode (HTA's tests/data/cupti_profiler): kernels replayed as counter ranges
            {
                "traceEvents": [
                    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 9.0},
                    {
                        "ph": "X",
                        "cat": "cuda_runtime",
                        "name": "cudaLaunchKernel",
                        "pid": 1,
                        "tid": 1,
                        "ts": 2.0,
                        "dur": 1.0,
                        "args": {"correlation": 1},
                    },
                    {
                        "ph": "X",
                        "cat": "cuda_profiler_range",
                        "name": "sm80_xmma_gemm",
                        "pid": 0,
                        "tid": 0,
                        "ts": 3.0,
                        "dur": 5.0,
                        "args": {"smsp__sass_thread_inst_executed_op_dfma_pred_on.sum": 0},
                    },
                ]
            },
            "CUPTI profiler counter-mode trace",
        ),
    ],
)
def test_other_accelerators_and_profilers_are_named(tmp_path, doc, says):
    p = tmp_path / "x.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(BadInput, match=says):
        ingest(p)


def test_folder_of_several_runs_is_refused_with_the_runs():
    """sample_traces/h200x2_pipeline holds four recordings of two ranks each: refused, naming them, not merged
    into one 8-rank run; one of them alone reads."""
    from plasmient_report.parsers import discover

    folder = sample_file("h200x2_pipeline/m4/rank0.pt.trace.json.gz").parent.parent
    with pytest.raises(BadInput) as e:
        discover([folder])
    msg = str(e.value)
    assert "several runs" in msg and "batch" in msg
    for run in ("m4/", "m8/", "d8192_m4/", "d8192_m8/"):
        assert run in msg
    assert len(discover([folder / "m4"])) == 2


def test_allocator_events_into_memory_events():
    """profile_memory=True `[memory]` events of device memory → memory_events (sizes, totals, UTC times).
    Truth: the JSON's own device-memory events (Device Type 1 CUDA / 6 HIP), counted and summed here."""
    path = corpus_file("public-real/kineto-resnet50-nw0/worker0.1623143089861.pt.trace.json.gz")
    ev = [e for e in _events(path) if e.get("name") == "[memory]" and e.get("ph") == "i"]
    dev = [e for e in ev if e["args"].get("Device Type") in (1, 6) and e["args"].get("Device Id", -1) >= 0]
    assert dev and len(dev) < len(ev)  # the trace has host allocations too: left out
    con = ingest(path)
    n, total, first = con.execute("SELECT count(*), sum(bytes_delta), min(ts_ns) FROM memory_events").fetchone()
    assert n == len(dev)
    assert total == sum(e["args"]["Bytes"] for e in dev)
    assert first == round(min(e["ts"] for e in dev) * 1000)


def test_memory_events_match_the_allocator_s_own_statistics():
    """sample_traces/h200_hf/llama_memory: one Llama step with profile_memory=True on an H200. Truth: the
    recording's torch.cuda memory statistics (truth.json: max_memory_allocated / reserved, memory_allocated at
    the step's start), measured outside the profiler."""
    import json as _json

    path = sample_file("h200_hf/llama_memory.pt.trace.json.gz")
    truth = _json.loads(sample_file("h200_hf/llama_memory.truth.json").read_text())["memory"]
    con = ingest(path)
    peak_alloc, peak_res, start_alloc = con.execute("""
        SELECT max(total_allocated), max(total_reserved), arg_min(total_allocated - bytes_delta, ts_ns)
        FROM memory_events""").fetchone()
    assert peak_alloc == truth["max_allocated_bytes"]
    assert peak_res == truth["max_reserved_bytes"]
    assert start_alloc == truth["allocated_at_step_start_bytes"]
    assert con.execute("SELECT DISTINCT device FROM memory_events").fetchall() == [(0,)]


# ------------------------------------------------------------------ the typed decode against DuckDB's JSON reader

from plasmient_report.parsers.kineto import decode  # noqa: E402

DECODE_TRACES = [
    "sample:h200_single/kineto_single.pt.trace.json.gz",  # today's torch: ops, kernels, copies, ranges
    "sample:h200_sync_stack/sync_stack.pt.trace.json.gz",  # Python stacks (with_stack=True)
    "sample:h200x2_ddp/kineto/rank0.pt.trace.json.gz",  # NCCL kernels with their collective metadata
    "sample:h200_hf/llama_memory.pt.trace.json.gz",  # allocator events (profile_memory=True)
    "corpus:public-real/kineto-resnet50-nw0/worker0.1623143089861.pt.trace.json.gz",  # torch 1.9: 'stream 7' tids
    "corpus:public-real/param-dlrm-v100x8/worker0_step_12.1694128201545.pt.trace.json.gz",  # record_param_comms
    "corpus:public-kineto-hta/amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",  # ROCm
]


def _trace(ref: str) -> Path:
    where, rel = ref.split(":", 1)
    return sample_file(rel) if where == "sample" else corpus_file(rel)


def _staged(path: Path, strict: bool) -> tuple[dict[str, list[tuple]], decode.Decoded]:
    con = store.connect()
    try:
        dec = decode.decode(path, con, strict=strict)
        # the same rows (DuckDB may insert them in any order); the per-category counts are per run, summed here
        out = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in decode.STAGES if t != "_kin_cats"}
        out["_kin_cats"] = con.execute(
            "SELECT cat, sum(n), sum(nameless) FROM _kin_cats GROUP BY cat ORDER BY cat NULLS FIRST"
        ).fetchall()
        return out, dec
    finally:
        con.close()


def _same_staging(path: Path) -> decode.Decoded:
    typed, dec = _staged(path, strict=True)
    reference, ref = _staged(path, strict=False)
    assert ref.runs == ref.lenient_runs and dec.events == ref.events
    for t in decode.STAGES:
        assert len(typed[t]) == len(reference[t]), t
        for a, b in zip(typed[t], reference[t], strict=True):
            assert a == b, f"{t}: {a} != {b}"
    return dec


@pytest.mark.parametrize("ref", DECODE_TRACES)
def test_typed_decode_gives_the_rows_of_duckdbs_json_reader(ref, monkeypatch):
    """The typed decode (msgspec Structs → Arrow columns) stages exactly the rows DuckDB's JSON reader stages
    with the same SQL over JSON columns, run boundaries included (runs made small so that every trace has
    many, and loads of several runs)."""
    monkeypatch.setattr(decode, "BATCH_BYTES", 256 << 10)
    monkeypatch.setattr(decode, "LOAD_BYTES", 1 << 20)
    dec = _same_staging(_trace(ref))
    assert dec.lenient_runs == 0, "the typed way was not taken"
    assert dec.runs > 3 or dec.events < 5000


def _kineto_recordings() -> list[str]:
    """Every Kineto recording of sample_traces/ and of the corpus (one skipping entry when it is absent)."""
    from plasmient_report.parsers._io import GuardedReader
    from plasmient_report.parsers.kineto import looks_like_kineto

    refs = []
    for where, root in (("sample", SAMPLES), ("corpus", CORPUS)):
        if not root.is_dir():
            refs.append(f"{where}:(absent)")
            continue
        for p in sorted(root.rglob("*.json*")):
            if p.is_file() and p.name.endswith((".json", ".json.gz")):
                with GuardedReader(p) as g:
                    if looks_like_kineto(g.read(4096)):
                        refs.append(f"{where}:{p.relative_to(root)}")
    return refs


@pytest.mark.parametrize("ref", _kineto_recordings())
def test_typed_decode_of_every_recording_gives_the_rows_of_duckdbs_json_reader(ref, monkeypatch):
    """Every Kineto recording we hold (29 committed H200 samples; the corpus's torch 1.8–2.x, ROCm, V100 / A100 /
    2080 Ti traces): the typed decode stages the rows of the lenient reference, runs of 1 MiB."""
    monkeypatch.setattr(decode, "BATCH_BYTES", 1 << 20)
    monkeypatch.setattr(decode, "LOAD_BYTES", 2 << 20)
    _same_staging(_trace(ref))


def _edited_sample(tmp_path: Path, edit) -> Path:
    doc = json.loads(gzip.decompress(sample_file("h200_single/kineto_single.pt.trace.json.gz").read_bytes()))
    edit(doc["traceEvents"])
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(doc, ensure_ascii=False))
    return out


def _by_cat(events, cat):
    return [e for e in events if e.get("cat") == cat and isinstance(e.get("args"), dict)]


def _mixed_types(ev):
    ops, ks = _by_cat(ev, "cpu_op"), _by_cat(ev, "kernel")
    for e, v in zip(ops[::97], ("17", "x", None, -5, 2**63 + 1), strict=False):
        e["args"]["External id"] = v  # strings and a UBIGINT: JSON text, TRY_CAST as before
    for e, v in zip(ks[::53], ("7", "stream 9", 3), strict=False):
        e["tid"] = v
        e["args"]["stream"] = v
    for e, v in zip(ops[1::89], (None, {"a": [1]}, "[[1, 2]]", 5, [[1, 2], 'é \x01 " \\ ']), strict=False):
        e["args"]["Input Dims"] = v  # null, an object, a string, a number, escapes: raw JSON
    for e, v in zip(ks[1::61], (1.5, "12", "1e3"), strict=False):
        e["args"]["bytes"] = v
    for e in ks[2::71]:
        e["args"]["grid"] = [1, "2", [3]]


def _old_spellings(ev):
    for e in _by_cat(ev, "kernel")[::3]:
        e["args"]["external id"] = e["args"].pop("External id", None)
        e["cat"] = "Kernel"  # torch 1.8's category
    for e in _by_cat(ev, "cpu_op")[::5]:
        if "Input Dims" in e["args"]:
            e["args"]["Input dims"] = e["args"].pop("Input Dims")


def _lenient_runs(ev):
    ops = _by_cat(ev, "cpu_op")
    ops[10]["args"]["External id"] = 5.5  # a float where a count belongs: that run goes the lenient way
    _by_cat(ev, "kernel")[5]["args"]["bytes"] = True
    ops[-10]["args"] = None


@pytest.mark.parametrize("edit", [_mixed_types, _old_spellings, _lenient_runs])
def test_typed_decode_of_odd_values_gives_the_rows_of_duckdbs_json_reader(edit, tmp_path, monkeypatch):
    monkeypatch.setattr(decode, "BATCH_BYTES", 128 << 10)
    monkeypatch.setattr(decode, "LOAD_BYTES", 512 << 10)
    dec = _same_staging(_edited_sample(tmp_path, edit))
    assert dec.runs > 3
    assert (dec.lenient_runs > 0) == (edit is _lenient_runs)


def test_an_event_that_is_no_object_is_refused_either_way(tmp_path):
    path = _edited_sample(tmp_path, lambda ev: ev.insert(len(ev) // 2, 5))
    for strict in (True, False):
        with pytest.raises(BadInput, match="bad event in traceEvents"):
            _staged(path, strict)


# ------------------------------------------------------------------ the splitter's thread (decode._Ahead)


def test_ahead_yields_in_order_and_raises_in_place() -> None:
    """The splitter's items come in their order; what it raises comes after the items before it, in the consuming
    thread; leaving early stops the thread and closes the iterator there."""
    import threading

    from plasmient_report.parsers.kineto.decode import _Ahead

    with _Ahead(iter(range(50)), depth=2) as items:
        assert list(items) == list(range(50))

    def failing():
        yield 1
        yield 2
        raise BadInput(None, "corrupt or truncated gzip")

    seen = []
    with pytest.raises(BadInput, match="truncated"), _Ahead(failing()) as items:
        for x in items:
            seen.append(x)
    assert seen == [1, 2]

    closed = threading.Event()

    def endless():
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.set()

    ahead = _Ahead(endless(), depth=2)
    with ahead as items:
        assert next(items) == 0
    assert closed.is_set() and not ahead._thread.is_alive()


def test_a_truncated_gzip_trace_is_one_clear_error(tmp_path: Path) -> None:
    """A gzip cut short fails while the splitter's thread reads it: the error reaches the run as BadInput, not as a
    thread's traceback (the reader's errors cross the thread)."""
    data = sample_file("h200_sync_stack/sync_stack.pt.trace.json.gz").read_bytes()  # committed: never skipped
    bad = tmp_path / "cut.pt.trace.json.gz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadInput, match="gzip"):
        ingest(bad)


@pytest.mark.parametrize(
    "rel", ["h200-single-kineto/kineto_single.json.gz", "public-real/param-resnet-2080ti/resnet_kineto.json.gz"]
)
def test_kernel_and_op_ids_count_the_events_in_time_order_and_the_tables_hold_them_so(rel):
    """kernel_id numbers the GPU events by start, op_id the ops by start then the longer first; ties (the resnet
    trace's µs times: ~1000 ops with another's start and duration) in the document's order. The truth is the JSON's
    own events, sorted so; the tables keep their rows in id order (nest_ops' ties read that order)."""
    path = corpus_file(rel)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ev = [(i, e) for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X" and e.get("name") is not None]
    gpu = sorted(((e["ts"], i, e["name"]) for i, e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")))
    ops = sorted(((e["ts"], -e.get("dur", 0), i, e["name"]) for i, e in ev if e.get("cat") == "cpu_op"))
    con = ingest(path)
    kernels = con.execute("SELECT kernel_id, raw_start, name FROM kernels").fetchall()  # (in the table's order)
    assert [k[0] for k in kernels] == sorted(k[0] for k in kernels)
    assert [(k[1], k[2]) for k in kernels] == [(g[0], g[2]) for g in gpu]
    rows = con.execute("SELECT op_id, raw_start, name FROM ops").fetchall()
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    assert [(r[1], r[2]) for r in rows] == [(o[0], o[3]) for o in ops]


def test_the_decode_leaves_the_stores_settings_as_it_found_them():
    """The decode runs with fewer DuckDB threads and no automatic checkpoints of its staging tables; the stages
    after it get the store's own settings back."""
    con = store.connect()
    con.execute("SET checkpoint_threshold = '32MiB'")
    settings = "SELECT current_setting('threads'), current_setting('checkpoint_threshold')"
    before = con.execute(settings).fetchall()
    pipeline.ingest(con, [sample_file("h200_sync_stack/sync_stack.pt.trace.json.gz")])
    assert con.execute(settings).fetchall() == before


@pytest.mark.parametrize("whole", [True, False])
def test_the_staging_tables_go_with_the_ingest_and_the_search_path_comes_back(tmp_path: Path, whole: bool) -> None:
    """The staging tables live in a database attached beside the store (decode.STAGE_DB, so that both of emit's
    connections see them) and are found through the search path: after an ingest, whole or failed (a gzip cut in
    half), none is left and the store's connection has its own search path back; run.duckdb never holds one."""
    data = sample_file("h200_sync_stack/sync_stack.pt.trace.json.gz").read_bytes()  # committed: never skipped
    trace = tmp_path / "t.pt.trace.json.gz"
    trace.write_bytes(data if whole else data[: len(data) // 2])
    con = store.connect_run(tmp_path / "store")
    try:
        path_setting = "SELECT current_setting('search_path')"
        before = con.execute(path_setting).fetchall()
        staged = (
            f"SELECT count(*) FROM duckdb_tables() WHERE database_name = '{decode.STAGE_DB}' OR starts_with(table_name, '_kin_')"
        )
        if whole:
            pipeline.ingest(con, [trace])
            assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] > 0
        else:
            with pytest.raises(BadInput, match="gzip"):
                pipeline.ingest(con, [trace])
        assert con.execute(path_setting).fetchall() == before == [("store.main",)]
        assert con.execute(staged).fetchone() == (0,)
        if whole:
            store.save(con, tmp_path / "run.duckdb")
            saved = duckdb.connect(str(tmp_path / "run.duckdb"), read_only=True)
            try:
                assert saved.execute(staged).fetchone() == (0,)
                assert saved.execute("SELECT count(*) FROM kernels").fetchone()[0] > 0
            finally:
                saved.close()
    finally:
        con.close()


def test_emits_two_chains_run_at_once_only_with_room_for_both_and_write_the_same_rows_either_way(monkeypatch) -> None:
    """emit writes the store from two connections at once while the staging tables take at most a quarter of DuckDB's
    memory limit (store.room_beside: two sorts at once would spill), else one chain after the other: the same rows in
    the same order either way (each table written by one chain, in one order)."""
    con = store.connect(memory_limit_bytes=256 << 20)
    try:
        assert store.room_beside(con)
        con.execute("CREATE TEMP TABLE big AS SELECT i, repeat('x', 300) || i AS s FROM range(300000) r(i)")  # ~90 MiB
        assert not store.room_beside(con)
    finally:
        con.close()
    trace = sample_file("h200_sync_stack/sync_stack.pt.trace.json.gz")  # committed: never skipped
    tables = ("kernels", "syncs", "ranges", "ops", "api_calls", "collectives", "memory_events", "devices", "profiler_overhead")
    out = {}
    for beside in (True, False):
        monkeypatch.setattr(store, "room_beside", lambda con, beside=beside: beside)
        c = ingest(trace)
        out[beside] = {t: c.execute(f"SELECT * FROM {t}").fetchall() for t in tables}  # (in the tables' order)
        c.close()
    assert out[True] == out[False] and len(out[True]["kernels"]) > 100 and len(out[True]["ranges"]) > 100
