"""Hostile inputs and faults: each must end in a correct result or one error line naming the input, never a
traceback, a silently wrong number, lost data or work without end.

The CLI runs in this process (``attnid.cli.main``), the tools in a subprocess; cases that train use the
smoke profile and the corpus and are marked ``slow``. Tested elsewhere: presets' progress
(``tests/test_hf.py``), the page check on a target that is no book and the book tool's refusals
(``tests/test_book.py``).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnid import AttentionConfig, cli, count
from attnid.audit import audit, audit_module, audit_torch_mha

ROOT = Path(__file__).resolve().parent.parent


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """``attnid ARGS`` in this process: (exit code, stdout, stderr)."""
    try:
        rc = cli.main(list(args))
    except SystemExit as e:  # argparse's own refusals
        rc = int(e.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_error_line(rc: int, err: str, *words: str, absent: tuple[str, ...] = ()) -> str:
    """A non-zero exit with one error line (argparse's usage aside) naming ``words`` and none of ``absent``."""
    assert "Traceback" not in err
    lines = [x for x in err.strip().splitlines() if x.strip() and not x.startswith(("usage:", " "))]
    assert rc != 0 and len(lines) == 1, err
    assert all(w.lower() in lines[0].lower() for w in words), lines[0]
    assert not any(w in lines[0] for w in absent), f"blames another input: {lines[0]}"
    return lines[0]


def refused(capsys, *args: str, words: tuple[str, ...] = (), absent: tuple[str, ...] = ()) -> str:
    rc, _, err = run_cli(capsys, *args)
    return one_error_line(rc, err, *words, absent=absent)


# ------------------------------------------------------------------------------ inputs refused in one line
MLA_REFUSED = (  # flags the latent-attention audit cannot use: refused by name, never dropped
    ["--preset", "llama-2-7b"],
    ["--batch", "4"],
    ["--seq-len", "4"],
    ["--causal"],
    ["--method", "dense"],
    ["--max-memory", "1"],
    ["--qk-norm", "head"],
)


@pytest.mark.parametrize(
    "args, words, absent",
    [
        (["audit", "--hf", "llama", "--embed", "0"], ("embed",), ()),
        (["audit", "--hf", "gpt2", "--heads", "0"], ("heads",), ()),
        (["audit", "--hf", "", "--embed", "8", "--heads", "2"], ("hf",), ()),
        (["audit", "--hf", "gpt2", "--max-memory", "0.001"], (), ()),
        (["audit", "--embed", "8", "--heads", "2", "--max-memory", "nan"], (), ()),
        (["audit", "--embed", "8", "--heads", "2", "--max-memory", "-1"], (), ()),
        (["audit", "--embed", "8", "--heads", "2", "--seq-len", "0"], (), ()),
        (["presets", "--threads", "-3"], ("threads",), ()),
        (["audit", "--hf", "llama", "--embed", "8", "--heads", "2", "--head-dim", "3"], ("head_dim",), ("rope_dims",)),
        # a flag the audited module does not have is refused, not dropped (the fifth review)
        (["audit", "--hf", "llama", "--qk-norm", "head"], ("qk-norm", "llama", "no QK-norm"), ()),
        (["audit", "--hf", "olmo2", "--qk-norm", "head"], ("qk-norm", "over the projection", "qwen3"), ()),
        (["audit", "-E", "8", "-H", "2", "--kv-rank", "4", "--q-rank", "3"], ("--kv-rank, --q-rank",), ()),
        (["audit", "-E", "8", "-H", "2", "--norm-eps", "0.05"], ("norm-eps", "--qk-norm"), ()),
        (["audit", "--hf", "llama", "-E", "8", "-H", "2", "--rope", "--head-dim", "0"], ("head_dim",), ()),
        (["audit", "--hf", "deepseek_v3", "--value-dim", "0"], ("v_dim",), ()),
        (["audit", "--hf", "deepseek_v3", "--head-dim", "0"], ("nope_dim",), ()),
        (["audit", "--hf", "deepseek_v3", "--block", "--ffn", "0"], ("ffn",), ()),
        # the latent-attention audit is sized before anything is allocated
        (["audit", "--hf", "deepseek_v3", "-H", "100000000"], ("GiB", "parameters"), ()),
        (["audit", "--hf", "deepseek_v3", "--block", "--ffn", "1000000000"], ("GiB",), ()),
        (["audit", "--hf", "deepseek_v3", "--block", "--experts", "100000000"], ("GiB",), ()),
        *((["audit", "--hf", "deepseek_v3", *flag], (flag[0],), ()) for flag in MLA_REFUSED),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_cli_refuses_in_one_line(capsys, args, words, absent):
    refused(capsys, *args, words=words, absent=absent)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: AttentionConfig(8, 2, rope=True, rope_base=0.0), "rope_base"),
        (lambda: AttentionConfig(8, 2, rope=True, rope_base=float("nan")), "rope_base"),
        (lambda: AttentionConfig(8, 2, rope=True, rope_base=-2.0), "rope_base"),
        (lambda: AttentionConfig(True, True), "embed"),
        (lambda: AttentionConfig(8, 2, groups=True), "groups"),
        (lambda: audit(AttentionConfig(8, 2), seq_len=2.5), "seq_len"),
        (lambda: audit(AttentionConfig(8, 2), seed="a"), "seed"),
        (lambda: audit_module("layer", (torch.randn(2, 4),)), "module"),
        (lambda: audit_torch_mha(torch.nn.MultiheadAttention(8, 2, kdim=4, vdim=4)), "kdim"),
        (lambda: audit_module(torch.nn.Linear(4, 4), (torch.full((3, 4), float("nan")),)), "inputs"),
    ],
)
def test_api_refuses_with_a_message_naming_the_argument(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_audit_hf_refuses_an_unknown_attention_implementation():
    from attnid.hf import audit_hf

    with pytest.raises(ValueError, match="attn_implementation"):
        audit_hf("llama", embed=8, heads=2, attn_implementation="bogus")


# ------------------------------------------------------------------------------ no silently wrong counts
def count_or_refusal(capsys, truth: int, *args: str) -> None:
    """The audit's JSON count equals ``truth``, or the audit refuses in one line."""
    rc, out, err = run_cli(capsys, *args, "--json")
    if rc:
        one_error_line(rc, err)
    else:
        assert json.loads(out)["unidentified"] == truth


def test_norm_eps_reaches_the_qk_norm_of_our_layer(capsys):
    """At ε = 0.05 the norm scales are no longer symmetries: 36 unidentified, not the ε = 0 count of 40."""
    count_or_refusal(capsys, 36, "audit", "-E", "8", "-H", "2", "--qk-norm", "head", "--norm-eps", "0.05")
    count_or_refusal(capsys, 40, "audit", "-E", "8", "-H", "2", "--qk-norm", "head")


def test_rope_audit_with_head_dim_above_embed_and_two_positions(capsys):
    args = ["audit", "--embed", "4", "--heads", "1", "--head-dim", "8", "--rope", "--seq-len", "2", "--batch", "16"]
    count_or_refusal(capsys, 56, *args)


@pytest.mark.parametrize("hf_type", ["gpt_neox", "phi"])
def test_partial_rotary_modules_rotate_exactly_the_dims_asked(capsys, hf_type):
    truth = count(AttentionConfig(12, 1, bias="all", rope_dims=8)).unidentified
    count_or_refusal(capsys, truth, "audit", "--hf", hf_type, "--embed", "12", "--heads", "1", "--rope-dims", "8")


@pytest.mark.parametrize(
    "make, truth",
    [
        (lambda: audit_torch_mha(torch.nn.MultiheadAttention(8, 2), batch=1), 80),
        (lambda: audit_torch_mha(torch.nn.MultiheadAttention(8, 2), seq_len=1), 80),
        (lambda: audit_module(torch.nn.MultiheadAttention(8, 2, batch_first=True), (torch.zeros(2, 8, 8),) * 3), 80),
        (lambda: count(AttentionConfig(8, 2, rope=True, rope_base=1.0)), 48),
        (lambda: audit(AttentionConfig(8, 2, bias="all"), rtol=1e-300), 80),
        (lambda: audit(AttentionConfig(8, 2, bias="all"), rtol=0.5), 80),
    ],
    ids=["mha batch 1", "mha seq_len 1", "all-zero inputs", "rope_base 1", "rtol 1e-300", "rtol 0.5"],
)
def test_awkward_inputs_give_the_true_count_or_a_refusal(make, truth):
    try:
        assert make().unidentified == truth
    except (ValueError, TypeError) as e:  # a refusal is fine, if it is attnid's
        assert "attnid" in e.__traceback__.tb_frame.f_code.co_filename or str(e)


@pytest.mark.parametrize("which", ["module", "mha"])
def test_audits_leave_the_callers_module_as_it_was(which):
    if which == "module":
        m = torch.nn.Linear(4, 3)
        audit_module(m, (torch.randn(5, 4),))
        assert m.weight.dtype == torch.float32
    else:
        m = torch.nn.MultiheadAttention(8, 2)
        audit_torch_mha(m)
        assert m.in_proj_weight.dtype == torch.float32


def test_audit_json_is_strict(capsys):
    rc, out, err = run_cli(capsys, "audit", "--embed", "32", "--heads", "4", "--bias", "all", "--json")
    assert rc == 0, err

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    json.loads(out, parse_constant=refuse)


def test_a_large_hf_audit_ends_or_is_refused(capsys):
    rc, _, err = run_cli(capsys, "audit", "--hf", "gpt2", "--embed", "128", "--heads", "4")
    if rc:
        one_error_line(rc, err)


# ------------------------------------------------------------------------------ damaged records and --force
@pytest.fixture(scope="module")
def smoke_cache(tmp_path_factory, corpus):
    """A finished smoke ``sgd`` record, trained once for the module."""
    cache = tmp_path_factory.mktemp("record-cache")
    env = {**os.environ, "ATTNID_RUNS": str(cache)}
    r = subprocess.run(
        [sys.executable, "-m", "attnid", "train", "--profile", "smoke", "--case", "sgd", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-500:]
    return cache


@pytest.fixture
def runs(smoke_cache, tmp_path, monkeypatch) -> Path:
    """A copy of the smoke record under a fresh runs folder, named by ``ATTNID_RUNS``."""
    shutil.copytree(smoke_cache / "smoke", tmp_path / "runs" / "smoke")
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs"


def retrain(capsys, *extra: str) -> tuple[int, str, str]:
    return run_cli(capsys, "train", "--profile", "smoke", "--case", "sgd", "--json", *extra)


def _summary_edit(change):
    def edit(d: Path) -> None:
        s = json.loads((d / "summary.json").read_text())
        change(s)
        (d / "summary.json").write_text(json.dumps(s))

    return edit


def _metrics_as_a_list(d: Path) -> None:
    with gzip.open(d / "metrics.jsonl.gz", "wt") as f:
        f.write("[1,2,3]\n")


DAMAGE = {
    "summary without its files list": _summary_edit(lambda s: s.pop("files")),
    "files = {}": _summary_edit(lambda s: s.update(files={})),
    "an edited final_val_loss": _summary_edit(lambda s: s.update(final_val_loss=0.1)),
    "an edited steps": _summary_edit(lambda s: s.update(steps=7)),
    "format 99": _summary_edit(lambda s: s.update(format=99)),
    'format "2"': _summary_edit(lambda s: s.update(format="2")),
    "files as a list": _summary_edit(lambda s: s.update(files=list(s["files"]))),
    "a files entry without bytes": _summary_edit(lambda s: next(iter(s["files"].values())).pop("bytes")),
    "metrics replaced by a valid gzip of [1,2,3]": _metrics_as_a_list,
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_record_is_named_not_reused(capsys, runs, damage):
    DAMAGE[damage](runs / "smoke" / "sgd")
    rc, _, err = retrain(capsys)
    one_error_line(rc, err)


@pytest.mark.slow
def test_force_with_a_bad_corpus_keeps_the_finished_record(capsys, runs, tmp_path, monkeypatch):
    bad = tmp_path / "three-bytes.txt"
    bad.write_text("abc")
    monkeypatch.setenv("ATTNID_DATA", str(bad))
    rc, _, err = retrain(capsys, "--force")
    one_error_line(rc, err)
    assert (runs / "smoke" / "sgd" / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("symlinked", [False, True], ids=["folder", "symlinked folder"])
def test_force_keeps_a_users_files(capsys, runs, tmp_path, symlinked):
    d = runs / "smoke" / "sgd"
    if symlinked:
        shutil.move(str(d), tmp_path / "elsewhere")
        d.symlink_to(tmp_path / "elsewhere")
    (d / "notes.txt").write_text("mine")
    rc, _, err = retrain(capsys, "--force")
    assert rc == 0, err
    assert (d / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_bf16_run_does_not_reuse_an_fp32_record_without_a_word(capsys, runs):
    _rc, _, err = retrain(capsys, "--precision", "bf16")
    assert "Traceback" not in err and "precision" in err.lower()


@pytest.mark.slow
def test_a_run_folder_symlinked_to_a_sibling_trains_through_it(capsys, tmp_path, monkeypatch, corpus):
    runs = tmp_path / "runs"
    (runs / "smoke" / "sibling").mkdir(parents=True)
    (runs / "smoke" / "sgd").symlink_to(runs / "smoke" / "sibling")
    monkeypatch.setenv("ATTNID_RUNS", str(runs))
    rc, _, err = retrain(capsys)
    assert rc == 0 or one_error_line(rc, err)


# ------------------------------------------------------------------------------ launchers
EXPERIMENTS = ("experiments", "--profile", "smoke", "--seed", "0")


def test_slurm_without_sbatch_is_refused_and_leaves_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "records"))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    refused(capsys, *EXPERIMENTS, "--launcher", "slurm", words=("sbatch",))
    assert not list(tmp_path.glob("*.pkl"))


def test_a_failing_sbatch_is_one_line(capsys, tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for cmd in ("srun", "sacct", "scancel", "squeue"):  # the rest of SLURM is there
        (bindir / cmd).write_text("#!/bin/sh\nexit 0\n")
    (bindir / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: invalid partition' >&2\nexit 1\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "records"))
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    rc, _, err = run_cli(capsys, *EXPERIMENTS, "--launcher", "slurm")
    err = "\n".join(x for x in err.splitlines() if not x.startswith("sbatch:"))  # sbatch's own stderr
    one_error_line(rc, err, "sbatch")


def test_a_log_dir_that_is_a_file_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "records"))
    (tmp_path / "a-file").write_text("")
    refused(capsys, *EXPERIMENTS, "--launcher", "local", "--log-dir", str(tmp_path / "a-file"))


def test_local_launcher_gets_the_threads_and_keeps_logs_under_the_runs_folder(capsys, tmp_path, monkeypatch):
    """The CLI hands ``--threads`` to every local job and puts submitit's logs under the runs folder, not the
    working directory (that the jobs then run with those threads: ``tests/test_launch.py``)."""
    from attnid.lm import launch as launch_mod

    seen = {}
    monkeypatch.setattr(launch_mod, "launch", lambda cfgs, launcher, **kw: seen.update(kw, launcher=launcher) or [])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "records"))
    rc, _, err = run_cli(capsys, *EXPERIMENTS, "--suite", "heads", "--launcher", "local", "--threads", "1")
    assert rc == 0, err
    assert seen["launcher"] == "local" and seen["threads"] == 1
    assert Path(seen["folder"]).is_relative_to(tmp_path / "records")


# ------------------------------------------------------------------------------ the tools
def tool(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / name), *args], capture_output=True, text=True)


def test_check_pages_refuses_screenshots_into_a_file(tmp_path):
    html = tmp_path / "html"
    html.mkdir()
    (html / "index.html").write_text("<html><body><p>page</p></body></html>")
    (tmp_path / "shots").write_text("")
    r = tool("check_pages.py", str(html), "--screenshots", str(tmp_path / "shots"))
    one_error_line(r.returncode, r.stderr)


def test_an_out_of_memory_jacobian_is_one_line_not_a_reverse_mode_retry(capsys, monkeypatch):
    """An allocation failure inside the forward-mode Jacobian is said as such (not taken for a kernel without
    forward-mode AD and retried in reverse mode, which fails again after as long)."""
    from attnid import audit as audit_mod

    calls = []

    def oom(*args, **kw):
        calls.append(1)
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried")

    monkeypatch.setattr(audit_mod, "chunked_jacobian", oom)
    monkeypatch.setattr(audit_mod.torch.autograd.functional, "jacobian", lambda *a, **k: pytest.fail("retried"))
    line = refused(capsys, "audit", "-E", "8", "-H", "1", "--method", "dense", words=("ran out of memory",))
    assert "can't allocate memory" in line and "--max-memory" in line and len(calls) == 1


def test_a_kernel_without_forward_mode_still_falls_back_to_reverse_mode(monkeypatch):
    import torch

    from attnid import audit as audit_mod

    def no_forward(*args, **kw):
        raise NotImplementedError("Trying to use forward AD with _fused_op that does not support it")

    monkeypatch.setattr(audit_mod, "chunked_jacobian", no_forward)
    res = audit_mod.jacobian_rank(lambda t: torch.stack([t[0] * t[1], t[0] * t[1]]), torch.tensor([1.0, 2.0]))
    assert res.rank == 1 and res.unidentified == 1


@pytest.mark.parametrize("chromium", ["missing", "dies"])
def test_check_pages_without_a_browser_is_one_line(tmp_path, chromium):
    """A Chromium that is missing, or that dies as it starts (as under a memory cap), is one error line, not a
    Playwright traceback."""
    pytest.importorskip("playwright")
    html = tmp_path / "html"
    html.mkdir()
    (html / "page.html").write_text("<html><body><p>page</p></body></html>")
    exe = tmp_path / "chromium"
    if chromium == "dies":
        exe.write_text("#!/bin/sh\necho 'cannot allocate memory' >&2\nexit 1\n")
        exe.chmod(0o755)
    r = tool("check_pages.py", str(html), "--chromium", str(exe), "--jobs", "1")
    line = one_error_line(r.returncode, r.stderr, "Chromium", "could not start", "no page was checked")
    assert r.returncode == 2 and str(exe) in line
