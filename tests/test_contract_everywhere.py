"""The main job on every trace we have — the shared corpus and our samples — writes all four outputs, the verdict
is the typed verdict exactly, and the contract holds (tests/contract.py: numbers in range, the waterfall closes for
the run, each GPU and each range, every rank present or reported missing, one clock record per source); every
trace kernel is a slice in trace.pftrace. Inputs that cannot be analysed give one clear error (BadInput) and
nothing written."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from plasmient_report import pipeline
from plasmient_report.errors import BadInput
from plasmient_report.render import perfetto
from plasmient_report.verdict_model import Verdict, load_verdict

from . import contract
from .conftest import CORPUS, SAMPLES

TRACES = [
    "h200-single-kineto/kineto_single.json.gz",
    "h200x2-small/kineto",
    "h200-single-nsys/nsys_workload.sqlite",
    "h200-single-nsys/nsys_small.sqlite",
    "public-nsys-nsysai/h100_2gpu_1s.sqlite",
    "public-nsys-nsysai/mfu_2gpu_before.sqlite",
    "public-nsys-nsysai/mock.sqlite",
    "public-nsys-pipit-cloverleaf/perlmutter-cloverleaf-cuda.sqlite",
    "public-nsys-pipit-saxpy-mpi/saxpy-mpi-cuda_nsys_perlmutter0.sqlite",
    *[f"public-kineto-hta/{p.name}" for p in sorted((CORPUS / "public-kineto-hta").glob("*.gz"))],
]
SAMPLE_RUNS = [
    "h200_single/kineto_single.pt.trace.json.gz",
    "h200_single/nsys_single.sqlite",
    "h200x2_ddp/kineto",
    "h200x2_ddp/nsys",
]
REFUSED = {"cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"}  # a CPU-only profile: no GPU to judge


def check(path: Path | list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    opts = pipeline.Options()
    inputs = path if isinstance(path, list) else [path]
    if inputs[0].name in REFUSED:
        with pytest.raises(BadInput):
            pipeline.analyse(inputs, opts)
        return
    watch = contract.Watch(inputs)
    res = pipeline.analyse(inputs, opts)
    try:
        _check_result(res, inputs, out, opts)
    finally:
        res.close()
    watch.check()


def _check_result(res: pipeline.Result, inputs: list[Path], out: Path, opts: pipeline.Options) -> None:
    pipeline.write_outputs(res, out, inputs, opts)
    assert sorted(p.name for p in out.iterdir()) == sorted(contract.OUTPUT_FILES)
    v = res.verdict
    # The verdict the judge built is the typed verdict, exactly: no key the model does not know (unknown fields
    # are forbidden), none missing, every type right — so verdict_model.py, verdict.schema.json and
    # docs/verdict.md cannot drift from what the tool writes. And what was written reads back the same.
    typed = msgspec.convert(v, Verdict, strict=True)
    assert load_verdict(out / "verdict.json") == typed
    contract.check_result(res)  # the numbers' invariants, the store's books, the clock records
    n_kernels = res.con.execute("SELECT count(*) FROM kernels WHERE rank IS NOT NULL").fetchall()[0][0]
    slices = (
        sum(
            1
            for p in perfetto.read_back(out / "trace.pftrace")
            if p.HasField("track_event") and p.track_event.type == perfetto.BEGIN and p.track_event.HasField("track_uuid")
        )
        if n_kernels < 50_000
        else None
    )
    if slices is not None:
        assert slices >= n_kernels


@pytest.mark.slow
@pytest.mark.parametrize("rel", TRACES)
def test_corpus_trace(rel, tmp_path):
    path = CORPUS / rel
    if not path.exists():
        pytest.skip(f"../shared/corpus not present ({rel})")
    check(path, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("rel", SAMPLE_RUNS)
def test_sample_run(rel, tmp_path):
    check(SAMPLES / rel, tmp_path)


# A trace with the counter logs and Nsight Compute CSVs recorded beside it.
CORPUS_WITH_LOGS = {
    "h200-single-kineto/kineto_single.json.gz": [
        "h200-single-kineto/ncu_raw.csv",
        "h200-single-kineto/nvidia_smi_dmon.txt",
        "h200-single-kineto/nvidia_smi_query.csv",
        "h200-single-kineto/nvml_samples.csv",
    ],
    "h200-single-nsys/nsys_small.sqlite": [
        "h200-single-nsys/nvidia_smi_dmon_nsys.txt",
        "h200-single-nsys/nvidia_smi_query_nsys.csv",
        "h200-single-nsys/nvml_samples_nsys.csv",
    ],
    "h200x2-small/kineto": [
        "h200x2-small/smi/dmon_default.txt",
        "h200x2-small/smi/dmon_o_DT.txt",
        "h200x2-small/smi/query_gpu.csv",
        "h200x2-small/kineto/dmon_during_run.txt",
        "h200x2-small/ncu/raw_metrics.csv",
        "h200x2-small/ncu/details_metrics.csv",
        "h200x2-small/ncu/raw_roofline.csv",
    ],
}
SAMPLES_WITH_LOGS = {
    "h200_single/kineto_single.pt.trace.json.gz": [
        "h200_single/nvidia_smi_dmon.txt",
        "h200_single/nvidia_smi_query.csv",
        "h200_single/nvml_samples.csv",
    ],
    "h200_single/nsys_single.sqlite": [
        "h200_single/nsys_nvidia_smi_dmon.txt",
        "h200_single/nsys_nvidia_smi_query.csv",
        "h200_single/nsys_nvml_samples.csv",
    ],
    "h200_align/kineto_bursts.pt.trace.json.gz": [
        "h200_align/nvidia_smi_dmon.txt",
        "h200_align/nvidia_smi_query.csv",
        "h200_align/nvml_samples.csv",
    ],
    "h200x2_pipeline/m4": [],
    "h200x2_pipeline/m8": [],
    "h200x2_pipeline/d8192_m4": [],
    "h200x2_pipeline/d8192_m8": [],
}


@pytest.mark.slow
@pytest.mark.parametrize("trace", list(CORPUS_WITH_LOGS))
def test_corpus_trace_with_its_logs(trace, tmp_path):
    paths = [CORPUS / trace, *(CORPUS / p for p in CORPUS_WITH_LOGS[trace])]
    if not all(p.exists() for p in paths):
        pytest.skip(f"../shared/corpus not present ({trace} and its logs)")
    check(paths, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("trace", list(SAMPLES_WITH_LOGS))
def test_sample_trace_with_its_logs(trace, tmp_path):
    check([SAMPLES / trace, *(SAMPLES / p for p in SAMPLES_WITH_LOGS[trace])], tmp_path)


def _every_file(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


# Every corpus file except the traces test_corpus_trace analyses whole (and big nsys exports, the same ones).
CORPUS_ALONE = [
    r for r in _every_file(CORPUS) if r not in TRACES and not (r.endswith(".sqlite") and (CORPUS / r).stat().st_size > 8 << 20)
]


@pytest.mark.slow
@pytest.mark.parametrize("rel", CORPUS_ALONE or ["(absent)"])
def test_every_corpus_file_alone_keeps_the_contract(rel, tmp_path):
    # Whatever the file (a trace, a counter log without its trace, a README, a CSV export of `nsys stats`):
    # a verdict whose numbers hold, or one line naming the file.
    if rel == "(absent)":
        pytest.skip("../shared/corpus not present")
    _alone(CORPUS / rel)


@pytest.mark.slow
@pytest.mark.parametrize(
    "rel",
    [
        r
        for r in _every_file(SAMPLES)
        # .nsys-rep: its export beside it is read (test_sample_run runs the report itself)
        if not r.startswith("generate/") and not r.endswith(".nsys-rep")
    ],
)
def test_every_sample_file_alone_keeps_the_contract(rel):
    _alone(SAMPLES / rel)


def _alone(path: Path) -> None:
    watch = contract.Watch([path])
    try:
        res = pipeline.analyse([path], pipeline.Options(write_html=False, write_trace=False))
    except BadInput as e:
        contract.one_line(str(e), [path])
        return
    finally:
        watch.check()
    try:
        contract.check_result(res)
    finally:
        res.close()
