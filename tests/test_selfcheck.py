"""`benchmarks/gpu/selfcheck.py`: on this CPU machine `--device cpu` runs the device checks (HF explorer and
teacher, fp32/bf16 learner, FSDP2 over gloo with 2 ranks, 3-update `divopd train` under lockstep and threads, the
learner's time against a bare forward+backward) and passes; `--device cuda` on a machine without CUDA records every
device row as skipped with the reason and exits 2 with one line; bad input is one line and exit 2."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu" / "selfcheck.py"
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1"}


def _in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """The script's ``main`` in this process (its exit code, stdout and stderr): the refusals run no check."""
    spec = importlib.util.spec_from_file_location("selfcheck", SCRIPT)
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    capsys.readouterr()
    code = script.main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess([str(SCRIPT), *args], code, out.out, out.err)


def _run(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout, check=False)


#: Every check but train_ray (a Ray start; the suite has its own Ray runs).
ALL_BUT_RAY = ["hf_explorer", "hf_teacher", "learner_fp32", "learner_bf16", "fsdp2", "train_lockstep", "train_threads",
               "learner_overhead", "vllm_reload", "vllm_nccl"]
#: The default suite's selection: every kind of row (a model check, the learner, one `divopd train`, the overhead
#: timing, the vLLM rows skipped with a reason) without the slower subprocess rows (fsdp2's two gloo ranks: FSDP2 over
#: gloo equal to world size 1 is tests/test_sharded.py's; train_threads: a second `divopd train`).
SMALL = ["hf_explorer", "hf_teacher", "learner_fp32", "learner_bf16", "train_lockstep", "learner_overhead",
         "vllm_reload", "vllm_nccl"]


def _check_cpu_rows(only: list[str], tmp_path: Path) -> dict[str, dict]:
    """Run ``--device cpu --only <only>``: exit 0, one JSON line per check on stdout and in ``--out``, every row that
    ran passed, the vLLM rows skipped with a reason; returns the rows by check."""
    out = tmp_path / "cpu.jsonl"
    proc = _run("--device", "cpu", "--out", str(out), "--only", *only)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    assert [r["check"] for r in rows] == only
    by = {r["check"]: r for r in rows}
    for r in rows:
        assert {"check", "status", "reason", "numbers", "device", "device_kind", "date"} <= set(r)
        assert r["device_kind"] == "cpu" and r["device"].startswith("cpu:")
    ran = [r for r in rows if not r["check"].startswith("vllm_")]
    assert all(r["status"] == "pass" for r in ran), [(r["check"], r["reason"]) for r in ran]
    assert by["hf_explorer"]["numbers"]["max_abs_err"] <= 2e-3 and by["hf_teacher"]["numbers"]["max_abs_err"] <= 2e-3
    assert by["learner_bf16"]["numbers"]["loss_rel_err"] <= 5e-2
    assert by["train_lockstep"]["numbers"]["updates"] == 3
    assert by["learner_overhead"]["numbers"]["step_over_bare"] > 0
    assert by["vllm_reload"]["status"] == "skip" and "vllm" in by["vllm_reload"]["reason"]  # the main venv: no vLLM
    assert by["vllm_nccl"]["status"] == "skip" and by["vllm_nccl"]["reason"]
    assert "| hf_explorer | tiny | pass |" in proc.stderr and "0 failed, 2 skipped" in proc.stderr
    return by


# Slow: every check on the CPU; by default its refusals below
@pytest.mark.slow
def test_selfcheck_on_the_cpu_passes_and_writes_one_json_line_per_check(tmp_path: Path) -> None:
    _check_cpu_rows(SMALL, tmp_path)


@pytest.mark.slow
def test_every_selfcheck_row_but_ray_passes_on_the_cpu(tmp_path: Path) -> None:
    by = _check_cpu_rows(ALL_BUT_RAY, tmp_path)
    assert by["fsdp2"]["numbers"]["backend"] == "gloo" and by["fsdp2"]["numbers"]["world_size"] == 2
    assert by["train_threads"]["numbers"]["updates"] == 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the skip path is the CPU machine's")
def test_cuda_asked_on_a_machine_without_cuda_skips_every_device_row_and_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cuda.jsonl"
    proc = _in_process(capsys, "--device", "cuda", "--out", str(out),
                       "--only", "hf_explorer", "fsdp2", "train_lockstep")
    assert proc.returncode == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["check"] for r in rows] == ["hf_explorer", "fsdp2", "train_lockstep"]
    assert all(r["status"] == "skip" and r["device_kind"] == "cuda" and "no CUDA device" in r["reason"]
               for r in rows)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("selfcheck: --device cuda asked, but this machine has no CUDA device")
    assert "Traceback" not in proc.stderr


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes\n")
    for args, needle in ((["--only", "warp_drive"], "unknown check warp_drive"),
                         (["--smollm2", str(tmp_path / "nope")], "not an HF model folder"),
                         (["--out", str(mine)], "not overwriting it")):
        proc = _in_process(capsys, "--device", "cpu", *args)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and needle in proc.stderr
    assert mine.read_text() == "my notes\n"


# ---------------------------------------------------------------------------------------------------- the docs table
def _gen_selfcheck():  # noqa: ANN202 (a module loaded from docs/)
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_selfcheck", REPO / "docs" / "gen_selfcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_home_table_is_built_from_the_committed_records() -> None:
    gen = _gen_selfcheck()
    home = (REPO / "docs" / "index.md").read_text()
    assert gen.section() in home, "docs/index.md's table is stale: run `python docs/gen_reference.py` (make docs)"
    assert home.count("| path | CPU | CUDA GPU |") == 1
    records = [json.loads(line) for f in sorted((REPO / "docs" / "selfcheck").glob("*.jsonl"))
               for line in f.read_text().splitlines()]
    assert records and all({"check", "status", "device_kind", "device", "date"} <= set(r) for r in records)
    table = gen.table()
    for path, checks, _ in gen.ROWS:
        line = next(x for x in table.splitlines() if x.startswith(f"| {path} |"))
        cpu, cuda = line.split(" | ")[1:3]
        passed = {r["check"] for r in records if r["device_kind"] == "cpu" and r["status"] == "pass"}
        assert cpu.startswith("**passed**") == bool(checks and set(checks) <= passed), path
        if not any(r["device_kind"] == "cuda" and r["status"] != "skip" for r in records):
            assert cuda == "**never run**", path  # no CUDA record committed: every CUDA cell says so


def test_a_row_says_passed_only_when_every_check_of_it_passed_on_that_device() -> None:
    gen = _gen_selfcheck()

    def rec(check: str, status: str, date: str, kind: str = "cuda") -> dict:
        return {"check": check, "status": status, "device_kind": kind, "device": f"{kind}: X", "date": date,
                "file": f"{date}-{kind}.jsonl"}

    row = ("hf_explorer", "hf_teacher")
    assert gen.cell([], row, "cuda") == "**never run**"
    assert gen.cell([rec("hf_explorer", "pass", "2027-01-01")], row, "cuda") == "**never run**"
    assert gen.cell([rec(c, "pass", "2027-01-01", "cpu") for c in row], row, "cuda") == "**never run**"
    assert gen.cell([rec(c, "skip", "2027-01-01") for c in row], row, "cuda") == "**never run**"
    both = [rec(c, "pass", "2027-01-01") for c in row]
    assert gen.cell(both, row, "cuda").startswith("**passed** 2027-01-01 ([2027-01-01-cuda.jsonl]")
    assert gen.cell([*both, rec("hf_teacher", "fail", "2027-02-01")], row, "cuda").startswith("**failed** 2027-02-01")
    assert gen.cell([rec("hf_teacher", "fail", "2027-01-01"), *[rec(c, "pass", "2027-02-01") for c in row]], row,
                    "cuda").startswith("**passed** 2027-02-01")
    assert gen.cell(both, (), "cuda") == "**never run**"  # a row no self-check covers
