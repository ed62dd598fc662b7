import json
import os
import shutil
import subprocess
import sys

import pytest

EXE = shutil.which("attnid", path=os.path.dirname(sys.executable)) or shutil.which("attnid")


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """Commands run in-process set torch's thread count; give the other tests theirs back."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def run(*args: str) -> subprocess.CompletedProcess:
    """``attnid ARGS`` run in this process, returned as a finished process (exit status, stdout, stderr): an
    import of torch saved per command. An unexpected exception is not turned into a status: it fails the test,
    as a traceback would. The tests that need a process of their own (signals, a closed pipe, two processes
    at once, the installed entry point) start one."""
    import contextlib
    import io

    from attnid.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's own refusals
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["attnid", *args], code, out.getvalue(), err.getvalue())


def test_count_json():
    r = run("count", "--embed", "64", "--heads", "8", "--bias", "all", "--json")
    assert r.returncode == 0
    d = json.loads(r.stdout)
    assert d["total_params"] == 16640 and d["unidentified"] == 1152
    assert set(d["unidentified_by_block"]) == {"qk", "vo", "key_bias", "value_bias"}
    assert d["identified_fraction"] == pytest.approx(1 - 1152 / 16640)


def test_count_preset_table():
    r = run("count", "--preset", "llama-2-70b")
    assert r.returncode == 0 and "1,024" in r.stdout and "identified fraction" in r.stdout


def test_audit_json():
    r = run("audit", "--embed", "8", "--heads", "2", "--bias", "all", "--causal", "--json")
    assert r.returncode == 0
    d = json.loads(r.stdout)
    assert d["unidentified"] == d["theory_unidentified"] == 80
    assert {"total_params", "rank", "unidentified", "sv_gap", "seconds"} <= set(d)


def test_presets_lists_models():
    r = run("presets", "--json")
    names = {row["name"] for row in json.loads(r.stdout)}
    assert {"gpt2", "llama-2-70b", "mistral-7b", "qwen2-7b"} <= names


@pytest.mark.parametrize(
    "args, word",
    [
        (["count", "--embed", "10", "--heads", "3"], "heads"),
        (["count", "--embed", "12", "--heads", "4", "--groups", "3"], "groups"),
        (["count", "--embed", "12", "--heads", "4", "--head-dim", "3", "--rope"], "head_dim"),
        (["count", "--preset", "nope"], "preset"),
        (["count", "--embed", "8", "--heads", "2", "--bias", "z"], "bias"),
        (["audit", "--embed", "8", "--heads", "2", "--seq-len", "1"], "seq"),
        (["audit", "--embed", "8", "--heads", "2", "--seq-len", "0"], "seq_len"),
        (["audit", "--embed", "4", "--heads", "1", "--head-dim", "8", "--rope", "--seq-len", "2"], "too few for RoPE"),
        (["audit", "--hf", ""], "model type"),
        (["audit", "--hf", "llama", "--embed", "0"], "embed"),
        (["audit", "--hf", "gpt2", "--heads", "0"], "heads"),
        (["audit", "--hf", "llama", "--embed", "8", "--heads", "2", "--head-dim", "3"], "head_dim must be even"),
        (["audit", "--hf", "gpt2", "--max-memory", "0.001"], "GiB"),
        (["audit", "--embed", "8", "--heads", "2", "--max-memory", "nan"], "max-memory"),
        (["audit", "--embed", "8", "--heads", "2", "--max-memory", "-1"], "max-memory"),
        (["presets", "--threads", "-3"], "threads"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, word, capsys):
    from attnid.cli import main

    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and word in lines[0]


def test_data_and_training_commands_validate_first(tmp_path):
    bad = tmp_path / "x.txt"
    bad.write_text("not shakespeare")
    r = run("data", "--path", str(bad))
    assert r.returncode == 2 and "sha256" in r.stderr
    r = run("train", "--profile", "cpu", "--case", "lion")
    assert r.returncode == 2 and "case" in r.stderr
    r = run("experiments", "--profile", "huge")
    assert r.returncode == 2 and "profile" in r.stderr


def test_train_reuses_records_and_names_damage(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path))
    cmd = ["train", "--profile", "smoke", "--case", "sgd", "--json"]
    r = run(*cmd)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["precision"] == "fp32" and s["steps"] == 50 and "metrics.jsonl.gz" in s["files"]
    (tmp_path / "smoke" / "sgd" / "heads.json").write_text("{}")
    r = run(*cmd)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "heads.json" in lines[0] and "--force" in lines[0]
    r = run(*cmd, "--force")
    assert r.returncode == 0, r.stderr


def test_audit_refuses_small_batch_and_bad_threads():
    r = run("audit", "--embed", "16", "--heads", "4", "--bias", "all", "--causal", "--batch", "1")
    assert r.returncode == 2 and "too few" in r.stderr and "Traceback" not in r.stderr
    for threads in ("0", "-1"):
        r = run("audit", "--embed", "8", "--heads", "2", "--threads", threads)
        assert r.returncode == 2 and "threads" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args, word",
    [
        (["count", "--preset", "gpt2", "--heads", "4"], "--heads cannot be combined with --preset"),
        (["count", "--config", "data/configs/gpt2.json", "--rope"], "--rope cannot be combined with --config"),
        (["train", "--profile", "smoke", "--seed", "-1"], "seed"),
        (["train", "--profile", "smoke", "--device", "mps"], "mps"),
        (["train", "--profile", "smoke", "--threads", "0"], "threads"),
        (["train", "--profile", "paper", "--case", "sgd"], "paper profile needs a GPU"),
        (
            ["train", "--profile", "smoke", "--device", "cpu", "--compile"],
            "compile: torch.compile is used on CUDA only",
        ),
        (["train", "--profile", "smoke", "--device", "cpu", "--precision", "tf32"], "tf32 exists on CUDA only"),
        (["experiments", "--profile", "smoke", "--stacked", "--device", "cpu", "--compile"], "CUDA only"),
        (["train", "--profile", "smoke", "--seed", "99999999999999999999999"], "seed must be an integer from 0"),
        (["audit", "--embed", "8", "--heads", "2", "--seed", "-1"], "seed must be an integer from 0"),
        (["audit", "--embed", "8", "--heads", "2", "--seed", "99999999999999999999999"], "seed must be"),
        (["audit", "--hf", "gpt2", "--seed", "-1"], "seed must be"),
        (["train", "--profile", "smoke", "--threads", "100000"], "threads must be from 1 to the"),
        (["experiments", "--profile", "smoke", "--stacked", "--parallel", "4"], "parallel"),
        (["experiments", "--profile", "smoke", "--stacked", "--wait"], "--wait only apply to --launcher slurm"),
        (["experiments", "--profile", "smoke", "--partition", "gpu"], "--partition only apply"),
        (["experiments", "--profile", "smoke", "--launcher", "local", "--time", "30"], "--time only apply"),
    ],
)
def test_more_bad_input_is_one_line(args, word, capsys):
    from attnid.cli import main

    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and word in lines[0]


def test_unwritable_runs_folder_is_one_line(tmp_path):
    import os

    blocker = tmp_path / "runs-file"
    blocker.write_text("a file, not a folder")
    env = {**os.environ, "ATTNID_RUNS": str(blocker)}
    r = subprocess.run([EXE, "train", "--profile", "smoke", "--case", "sgd"], capture_output=True, text=True, env=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "ATTNID_RUNS" in lines[0] and "Traceback" not in r.stderr


def test_audit_of_a_large_preset_is_refused_before_it_starts():
    r = run("audit", "--preset", "gpt2")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "GiB" in lines[0] and "attnid count" in lines[0]
    r = run("audit", "--embed", "16", "--heads", "4", "--max-memory", "0.000001")
    assert r.returncode == 2 and "GiB" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("signame, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_or_sigterm_during_train_says_how_to_resume(tmp_path, signame, code):
    """Ctrl-C, and SIGTERM (which ended the run without a word), each leave one line: where it stopped, how to
    resume."""
    import signal

    env = {**os.environ, "ATTNID_RUNS": str(tmp_path)}
    p = subprocess.Popen(
        [EXE, "train", "--profile", "cpu", "--case", "sgd", "--threads", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a test run started in the background (nohup, `&`) ignores SIGINT, and so would the child
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # wait for an event, not a time: the progress bar reporting a step taken inside the loop
    import re
    import threading

    err_parts: list[str] = []
    started = threading.Event()

    def read_stderr():
        assert p.stderr is not None
        while chunk := p.stderr.read(1):
            err_parts.append(chunk)
            if chunk in "\r\n" and re.search(r"\| *[1-9]\d*/2000", "".join(err_parts[-200:])):
                started.set()
        started.set()  # the process ended

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    assert started.wait(timeout=600), "the training loop never reported a step"
    p.send_signal(getattr(signal, signame))
    p.wait(timeout=300)
    reader.join(timeout=60)
    err = "".join(err_parts)
    assert p.returncode == code, err[-2000:]
    assert f"interrupted ({signame}) at step" in err and "rerun the same command to resume" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_two_processes_on_one_run_share_it(tmp_path):
    env = {**os.environ, "ATTNID_RUNS": str(tmp_path)}
    cmd = [EXE, "train", "--profile", "smoke", "--case", "adamw", "--json", "--threads", "1"]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-500:] for o in outs]
    summaries = [json.loads(o[0]) for o in outs]
    assert summaries[0]["wall_seconds"] == summaries[1]["wall_seconds"]  # trained once, reused once
    assert not list((tmp_path / "smoke").glob("**/*.tmp"))


def test_stacked_trains_in_this_process_only(capsys):
    from attnid.cli import main

    assert main(["experiments", "--profile", "smoke", "--stacked", "--launcher", "local"]) == 2
    assert "stacked" in capsys.readouterr().err


def _strict_loads(text: str):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    "args",
    [
        ["count", "--embed", "64", "--heads", "8", "--bias", "all", "--json"],
        ["audit", "--embed", "8", "--heads", "2", "--bias", "all", "--json"],
        ["audit", "--embed", "32", "--heads", "4", "--bias", "all", "--json"],  # certify: an infinite gap
        ["presets", "--json"],
        ["claims", "--profile", "paper", "--json"],
    ],
)
def test_every_json_output_is_strict_json(args, capsys):
    from attnid.cli import main

    assert main(args) == 0
    assert _strict_loads(capsys.readouterr().out)


def test_strict_json_writes_null_for_non_finite_numbers():
    from attnid.cli import strict_json

    assert _strict_loads(strict_json({"gap": float("inf"), "x": [float("nan"), 1.0]})) == {
        "gap": None,
        "x": [None, 1.0],
    }


def test_a_count_without_closed_form_says_so(capsys):
    from attnid.cli import main

    assert main(["audit", "--embed", "4", "--heads", "1", "--head-dim", "8", "--rope", "--json"]) == 0
    out = _strict_loads(capsys.readouterr().out)
    assert out["theory_unidentified"] is None and out["status"].startswith("measured, no closed form")
    assert out["unidentified"] == 56
    assert main(["audit", "--embed", "8", "--heads", "2", "--json"]) == 0
    assert _strict_loads(capsys.readouterr().out)["status"].startswith("verified")


def test_hf_type_is_case_insensitive_as_presets_are(capsys):
    from attnid.cli import main

    assert main(["audit", "--hf", "GPT2", "--embed", "8", "--heads", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hf_type"] == "gpt2"


def test_a_closed_pipe_ends_quietly():
    """`attnid presets --json | head -1`: the reader leaves early; no error line, no resume advice. Here the
    reader closes the pipe before anything is written, so the write fails for certain."""
    cmd = [EXE] if EXE else [sys.executable, "-m", "attnid"]
    proc = subprocess.Popen([*cmd, "presets", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=300)
    assert proc.returncode == 0 and "error" not in err and "resumes" not in err and "Traceback" not in err, err


def test_help_and_version_start_without_torch():
    """``attnid --help`` and ``--version`` import no torch (here: torch made unimportable) and list every command
    with the exit codes; a subcommand that needs torch stops with the extra to install (tests/test_core.py has the
    rest)."""
    from attnid import __version__
    from attnid.cli.commands import COMMANDS

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from attnid.cli import main\n"
        "try:\n    sys.exit(main(sys.argv[1:]))\nexcept SystemExit as e:\n    sys.exit(e.code)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert all(name in r.stdout for name in COMMANDS) and "exit codes:" in r.stdout and "130" in r.stdout
    r = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == f"attnid {__version__}"
    r = subprocess.run([sys.executable, "-c", code, "audit", "--embed", "8", "--heads", "2"], capture_output=True)
    assert r.returncode == 2 and b"attnid[audit]" in r.stderr  # the control: the subcommand does need torch


def test_every_subcommand_has_a_description_examples_and_help_on_every_option():
    import argparse

    from attnid.cli import build_parser
    from attnid.cli.commands import COMMANDS, EXIT_CODES

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(COMMANDS)
    for name, p in sub.choices.items():
        assert p.description and "examples:" in p.epilog and EXIT_CODES in p.epilog, name
        assert [e for e in COMMANDS[name].examples if not e.startswith(f"attnid {name}")] == []
        assert [a.option_strings for a in p._actions if a.option_strings and not a.help] == [], name
        assert any("--json" in a.option_strings for a in p._actions), name  # every command speaks JSON


def test_a_missing_folder_is_bad_input_with_its_fix():
    for flag, fix in (("--run", "a finished run's folder"), ("--checkpoint", "save_pretrained folder")):
        r = run("audit", flag, "/no/such/folder")
        assert r.returncode == 2 and fix in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_data_speaks_json(corpus):
    from attnid.lm.data import corpus_path

    r = run("data", "--path", str(corpus_path()), "--json")
    got = json.loads(r.stdout)
    assert r.returncode == 0 and got["verified"] is True and len(got["sha256"]) == 64 and got["bytes"] > 1_000_000


def test_count_from_flags_says_the_qk_norms_epsilon_and_takes_norm_eps():
    """At ε = 0 (the default) the count has each norm's scale free, and says so with how many; --norm-eps counts a
    released model's ε > 0; it is refused without a norm and beside a preset, which fixes its own."""
    at_zero = run("count", "-E", "16", "-H", "4", "-G", "2", "--rope", "--qk-norm", "head", "--json")
    released = run("count", "-E", "16", "-H", "4", "-G", "2", "--rope", "--qk-norm", "head", "--norm-eps", "1e-6",
                   "--json")  # fmt: skip
    a, b = json.loads(at_zero.stdout), json.loads(released.stdout)
    assert a["architecture"]["qk_norm_eps"] == 0.0 and b["architecture"]["qk_norm_eps"] == 1e-6
    assert a["unidentified"] - b["unidentified"] == 4 + 2  # H + G per-head scales
    text = run("count", "-E", "16", "-H", "4", "-G", "2", "--rope", "--qk-norm", "head").stdout
    assert "QK-norm at ε = 0, the exact symmetric point: 6 directions more" in text
    for args, says in ((["-E", "16", "-H", "4", "--norm-eps", "1e-6"], "this attention has no norm"),
                       (["--preset", "qwen3-8b", "--norm-eps", "1e-6"], "--preset fixes the norms' ε")):  # fmt: skip
        r = run("count", *args)
        assert r.returncode == 2 and says in r.stderr


def test_an_unknown_flag_of_a_subcommand_is_refused_with_that_subcommands_usage():
    r = run("count", "--preset", "gpt2", "--bogus")
    assert (
        r.returncode == 2
        and r.stderr.startswith("usage: attnid count ")
        and "unrecognized arguments: --bogus" in r.stderr
    )


def test_the_exceptions_the_command_maps_to_exit_codes_exist_where_it_looks():
    """main() catches them by module and name once loaded (so `count` loads no torch to catch them): each is there."""
    import importlib

    from attnid.cli import BAD_INPUT, FAILED_CHECK, _loaded

    for name in (*BAD_INPUT, *FAILED_CHECK, "lm.launch:Stopped", "lm.lifecycle:Interrupted"):
        module, cls = name.split(":")
        assert issubclass(getattr(importlib.import_module(f"attnid.{module}"), cls), Exception), name
    assert len(_loaded(FAILED_CHECK)) == len(FAILED_CHECK)  # all four loaded by now
