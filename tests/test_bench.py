"""The benchmarks and the one-window records script run their logic on the CPU at the smoke profile."""

import json
import subprocess
import sys

import pytest
from booktool import ROOT, tool

pytestmark = pytest.mark.usefixtures("corpus")


def test_the_stacked_bench_measures_every_stack_size_on_the_cpu(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench.py"), "--gpu", "--device", "cpu", "--stack-sizes", "1", "3",
         "--steps", "3", "--json", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    got = json.loads(out.read_text())
    assert set(got["measured"]) == {"1", "3"} and got["profile"] == "smoke"
    one, three = got["measured"]["1"], got["measured"]["3"]
    assert one["ops"] == three["ops"]  # three stacked runs take as many operators per step as one
    assert all(v > 0 for m in (one, three) for k, v in m.items() if k != "ops")
    assert set(got["suites"]) == {"dynamics", "heads", "points"} and got["suites"]["dynamics"]["seconds"] > 0
    assert "projected wall time of each suite" in run.stdout and "ms/run-step" in run.stdout
    # the file one tool writes is the file the other reads: the records script takes this bench as it is
    assert set(tool("paper_records").bench_rates(out, compile=False)) == {1, 3}


def test_paper_records_trains_what_fits_and_packs_the_records(tmp_path, monkeypatch, capsys):
    import tarfile

    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "runs"))
    records_tool = tool("paper_records")
    pack = tmp_path / "records.tar.gz"
    # a rate that makes the second stack miss the deadline: it is skipped, not started
    args = ["--minutes", "1", "--profile", "smoke", "--device", "cpu", "--plan", "points:0", "--pack", str(pack)]
    assert records_tool.main([*args, "--rate-ms", "0.1"]) == 0
    text = capsys.readouterr().out
    assert "training 4 runs as one stack" in text and "packed 4 records" in text
    with tarfile.open(pack) as tar:
        names = tar.getnames()
    assert "smoke/points_adamw/summary.json" in names and not any(n.endswith(".pt") for n in names)
    assert records_tool.main([*args[:6], "--plan", "points:1", "--rate-ms", "1e6"]) == 0
    assert "skipped (4 runs" in capsys.readouterr().out
    assert records_tool.main(["--minutes", "0"]) == 2  # bad input: one line, exit 2


@pytest.mark.parametrize(
    "args, words",
    [
        (["--gpu", "--device", "cpu", "--compile"], "compile: torch.compile is used on CUDA only"),
        (["--gpu", "--device", "cpu", "--precision", "tf32"], "tf32 exists on CUDA only"),
        (["--gpu", "--device", "cpu", "--E", "64"], "--E do not apply with --gpu"),
        (["--only", "audit", "--json", "x.json", "--compile"], "--compile, --json only apply with --gpu"),
    ],
)
def test_the_bench_refuses_flags_it_would_not_honour(args, words):
    with pytest.raises(SystemExit) as refused:
        tool("bench").main(args)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_a_compiled_stack_is_projected_with_its_compilation_and_read_only_with_compile(tmp_path, capsys):
    """The bench times a compiled stack's compilation apart (``compile_s``): the projection adds it once per
    stack, and paper_records refuses a bench measured with another --compile than its own."""
    from attnid.lm.profiles import make_config

    bench, records_tool = tool("bench"), tool("paper_records")
    stack = [make_config("smoke", c) for c in ("sgd", "adamw")]
    eager = {2: {"step_s": 0.01, "eval_s": 0.5, "heads_s": 2.0}}
    compiled = {2: {**eager[2], "compile_s": 30.0}}
    assert bench.project_stack_seconds(compiled, stack) == pytest.approx(bench.project_stack_seconds(eager, stack) + 30)
    f = tmp_path / "bench.json"
    f.write_text(json.dumps({"compiled": True, "measured": compiled}))
    assert records_tool.bench_rates(f, compile=True) == compiled
    with pytest.raises(SystemExit, match="measured with --compile"):
        records_tool.bench_rates(f, compile=False)
    f.write_text(json.dumps({"measured": eager}))  # a bench of before the flag: eager
    with pytest.raises(SystemExit, match="measured without --compile"):
        records_tool.bench_rates(f, compile=True)
    assert records_tool.main(["--minutes", "1", "--device", "cpu", "--compile"]) == 2
    assert "compile: torch.compile is used on CUDA only" in capsys.readouterr().err


GOOD_TIMES = {"step_s": 0.01, "eval_s": 0.5, "heads_s": 2.0}
BAD_BENCH_JSON = {
    "not JSON": "{",
    "a list": "[]",
    "no measured": "{}",
    "measured empty": '{"measured": {}}',
    "measured a list": '{"measured": [1]}',
    "a stack size of 0": json.dumps({"measured": {"0": GOOD_TIMES}}),
    "a stack size that is no number": json.dumps({"measured": {"x": GOOD_TIMES}}),
    "times a list": json.dumps({"measured": {"3": [1]}}),
    "a time missing": json.dumps({"measured": {"3": {"step_s": 0.01}}}),
    "a zero step": json.dumps({"measured": {"3": {**GOOD_TIMES, "step_s": 0}}}),
    "a negative evaluation": json.dumps({"measured": {"3": {**GOOD_TIMES, "eval_s": -1}}}),
    "a NaN step": json.dumps({"measured": {"3": {**GOOD_TIMES, "step_s": float("nan")}}}),
    "a string time": json.dumps({"measured": {"3": {**GOOD_TIMES, "heads_s": "2"}}}),
    "an unknown time": json.dumps({"measured": {"3": {**GOOD_TIMES, "warp_s": 1}}}),
    "operators not a count": json.dumps({"measured": {"3": {**GOOD_TIMES, "ops": 2.5}}}),
    "compiled not a bool": json.dumps({"compiled": "yes", "measured": {"3": GOOD_TIMES}}),
    "nested too deep": "[" * 100_000,
}


@pytest.mark.parametrize("plant", list(BAD_BENCH_JSON))
def test_paper_records_checks_the_bench_it_is_given(tmp_path, plant):
    """Planted: each kind of damaged bench JSON (which gave a traceback, or projected a stack that cannot finish
    before the deadline as one that fits) is refused in one line naming the file; a good one is read (the control)."""
    records_tool = tool("paper_records")
    f = tmp_path / "bench.json"
    f.write_text(json.dumps({"measured": {"3": GOOD_TIMES}}))
    assert records_tool.bench_rates(f, compile=False) == {3: GOOD_TIMES}
    f.write_text(BAD_BENCH_JSON[plant])
    with pytest.raises(SystemExit) as refused:
        records_tool.bench_rates(f, compile=False)
    assert str(f) in str(refused.value) and "\n" not in str(refused.value)


def test_paper_records_refuses_a_fifo_as_its_bench_without_waiting(tmp_path):
    """A FIFO would block a read for ever: refused as not a regular file."""
    import os

    f = tmp_path / "bench.json"
    os.mkfifo(f)
    with pytest.raises(SystemExit, match="not a regular file"):
        tool("paper_records").bench_rates(f, compile=False)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--gpu", "--device", "cpu", "--stack-sizes", "0"], "--stack-sizes must be whole numbers >= 1"),
        (["--gpu", "--device", "cpu", "--steps", "0"], "--steps must be whole numbers >= 1"),
        (["--only", "train", "--repeats", "0"], "--repeats must be whole numbers >= 1"),
        (["--gpu", "--device", "cpu", "--json", "/no/such/folder/b.json"], "its folder does not exist"),
    ],
)
def test_the_bench_checks_its_numbers_and_its_json_folder_before_it_runs(args, words):
    with pytest.raises(SystemExit) as refused:
        tool("bench").main(args)
    assert words in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--minutes", "0"], "--minutes must be positive"),
        (["--minutes", "1", "--plan", "dynamics:x"], "seeds are whole numbers"),
        (["--minutes", "1", "--plan", "nope"], "unknown suite"),
    ],
)
def test_paper_records_refuses_bad_input_with_exit_2_and_one_line(tmp_path, capsys, args, says):
    assert tool("paper_records").main([*args, "--profile", "smoke", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    bench = tmp_path / "bench.json"
    bench.write_text("{")
    assert tool("paper_records").main(["--minutes", "1", "--device", "cpu", "--bench", str(bench)]) == 2
