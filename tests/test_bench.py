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
    with pytest.raises(SystemExit, match="--minutes must be positive"):
        records_tool.main(["--minutes", "0"])
