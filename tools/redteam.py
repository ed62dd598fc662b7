"""Reliability red-team: hostile inputs and faults against a source tree, each classified.

    python tools/redteam.py [--tree PATH] [--only SUBSTRING] [--json]

Runs every case against ``PATH/src`` (default: this checkout) in fresh processes with the current
Python, and prints one line per case and a table by kind:

* ``clean``: a correct result, or one error line and a non-zero exit (an attnid ``ValueError`` or
  ``TypeError`` naming the argument, for the Python API);
* ``traceback``: a Python traceback, or a raw library exception from the Python API;
* ``silent``: exit 0 with a wrong result, an input ignored, damage done, or no end in sight (timeout).

Point ``--tree`` at a worktree of an older commit to measure before and after. Cases that need
training use the smoke profile and the corpus (``ATTNID_DATA``). Two cases are not scripted here
and are covered by tests instead: a killed local-launcher child and a full disk; a read-only run
folder is skipped when running as root (root writes anyway).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = "Traceback (most recent call last)"


@dataclass
class Case:
    name: str
    kind: str  # "cli" (CLI, tools, faults) or "api" (Python API)
    run: Callable[[Path, Path], tuple[str, str]]  # (tree, scratch) -> (outcome, detail)


def patience(seconds: float) -> float:
    """A timeout that means "no end in sight", not "slow": ``seconds`` on an idle machine, stretched by the
    1-minute load per core (a case that takes 300 s idle takes far longer beside two busy loops)."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load = 0.0
    return seconds * max(1.0, 1.0 + load) * 2


def sh(tree: Path, args: list[str], *, env: dict | None = None, cwd: Path | None = None, timeout: float = 300,
       tool: str | None = None) -> subprocess.CompletedProcess | None:  # fmt: skip
    """``python -m attnid ARGS`` (or ``python tools/TOOL ARGS``) with ``tree/src`` first on the path;
    ``None`` when it does not end within :func:`patience` of ``timeout``."""
    cmd = [sys.executable, str(tree / "tools" / tool)] if tool else [sys.executable, "-m", "attnid"]
    e = {**os.environ, "PYTHONPATH": str(tree / "src"), **(env or {})}
    try:
        return subprocess.run(
            cmd + args, capture_output=True, text=True, env=e, cwd=cwd or tree, timeout=patience(timeout)
        )
    except subprocess.TimeoutExpired:
        return None


def one_line_error(r: subprocess.CompletedProcess | None, *words: str, absent: tuple[str, ...] = ()) -> tuple[str, str]:
    """Expected: a non-zero exit with one stderr line (naming ``words``, and none of ``absent``: an error
    that blames an input nobody gave misleads), no traceback."""
    if r is None:
        return "silent", "timeout"
    out = r.stdout + r.stderr
    if TRACE in out:
        return "traceback", out.strip().splitlines()[-1][:120]
    lines = [x for x in r.stderr.strip().splitlines() if x.strip() and not x.startswith(("usage:", " "))]
    if r.returncode == 0:
        return "silent", "exit 0: " + (r.stdout.strip().splitlines() or [""])[-1][:100]
    if len(lines) != 1 or not all(w.lower() in lines[0].lower() for w in words):
        return "traceback", f"{len(lines)} lines: " + (lines[-1][:100] if lines else "")
    if any(w in lines[0] for w in absent):
        return "silent", "blames another input: " + lines[0][:100]
    return "clean", lines[0][:120]


def cli_error(*args: str, words: tuple[str, ...] = (), absent: tuple[str, ...] = ()) -> Callable:
    return lambda tree, tmp: one_line_error(sh(tree, list(args)), *words, absent=absent)


def cli_count(args: list[str], truth: int, *, timeout: float = 300) -> Callable:
    """Expected: the count ``truth``, or a clean refusal."""

    def run(tree: Path, tmp: Path) -> tuple[str, str]:
        r = sh(tree, [*args, "--json"], timeout=timeout)
        if r is None:
            return "silent", "timeout"
        if r.returncode:
            return one_line_error(r)
        got = json.loads(r.stdout)["unidentified"]
        return ("clean" if got == truth else "silent"), f"unidentified {got} (truth {truth})"

    return run


def api(code: str, *, error: str | None = None, check: str | None = None) -> Callable:
    """Run ``code`` in a fresh interpreter. ``error``: a word that the message of an attnid ``ValueError`` or
    ``TypeError`` must hold; otherwise ``check`` is an expression that must be true after the code, and an error is a
    clean refusal only if it is a ValueError/TypeError from attnid."""
    body = textwrap.dedent(code)
    probe = f"""
import json, sys, traceback
try:
{textwrap.indent(body, "    ")}
    ok = {check or "True"}
    print("RESULT", json.dumps(bool(ok)))
except BaseException as e:
    tb = traceback.extract_tb(e.__traceback__)
    where = "attnid" if tb and "attnid" in tb[-1].filename else "library"
    print("EXC", type(e).__name__, where, str(e).splitlines()[0][:150] if str(e) else "")
"""

    def run(tree: Path, tmp: Path) -> tuple[str, str]:
        e = {**os.environ, "PYTHONPATH": str(tree / "src")}
        try:
            r = subprocess.run(
                [sys.executable, "-c", probe], capture_output=True, text=True, env=e, timeout=patience(300)
            )
        except subprocess.TimeoutExpired:
            return "silent", "timeout"
        last = [x for x in r.stdout.splitlines() if x.startswith(("RESULT", "EXC"))]
        if not last:
            return "traceback", (r.stderr.strip().splitlines() or ["no output"])[-1][:120]
        parts = last[-1].split(" ", 3) + ["", ""]
        if parts[0] == "RESULT":
            if error:
                return "silent", "no error raised"
            return ("clean" if parts[1] == "true" else "silent"), "result " + ("as expected" if parts[1] == "true"
                                                                             else "wrong")  # fmt: skip
        etype, where, msg = parts[1], parts[2], parts[3]
        if error:
            if etype in ("ValueError", "TypeError") and where == "attnid" and error.lower() in msg.lower():
                return "clean", f"{etype}: {msg[:100]}"
            return "traceback", f"{etype} ({where}): {msg[:100]}"
        if etype in ("ValueError", "TypeError") and where == "attnid":
            return "clean", f"refused: {etype}: {msg[:100]}"
        return "traceback", f"{etype} ({where}): {msg[:100]}"

    return run


# ------------------------------------------------------------------------------------- run records
def smoke_record(tree: Path, tmp: Path) -> Path:
    """A finished smoke ``sgd`` record under ``tmp/runs`` (trained once per tree, then copied)."""
    cache = tmp / "record-cache"
    if not (cache / "smoke" / "sgd" / "summary.json").exists():
        r = sh(tree, ["train", "--profile", "smoke", "--case", "sgd", "--json"], env={"ATTNID_RUNS": str(cache)})
        if r is None or r.returncode:
            raise RuntimeError(f"could not train the smoke record: {r and r.stderr[-500:]}")
    runs = Path(tempfile.mkdtemp(dir=tmp, prefix="runs-"))
    shutil.copytree(cache / "smoke", runs / "smoke")
    return runs


def retrain(tree: Path, runs: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess | None:
    return sh(tree, ["train", "--profile", "smoke", "--case", "sgd", "--json", *extra],
              env={"ATTNID_RUNS": str(runs), **(env or {})})  # fmt: skip


def damaged(edit: Callable[[Path], None]) -> Callable:
    """Expected: a damaged record is named in one line (with --force), not reused."""

    def run(tree: Path, tmp: Path) -> tuple[str, str]:
        runs = smoke_record(tree, tmp)
        edit(runs / "smoke" / "sgd")
        return one_line_error(retrain(tree, runs))

    return run


def edit_summary(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        s = json.loads((d / "summary.json").read_text())
        change(s)
        (d / "summary.json").write_text(json.dumps(s))

    return edit


def metrics_as_list(d: Path) -> None:
    with gzip.open(d / "metrics.jsonl.gz", "wt") as f:
        f.write("[1,2,3]\n")


def force_with_bad_corpus(tree: Path, tmp: Path) -> tuple[str, str]:
    runs = smoke_record(tree, tmp)
    bad = tmp / "three-bytes.txt"
    bad.write_text("abc")
    r = retrain(tree, runs, "--force", env={"ATTNID_DATA": str(bad)})
    kept = (runs / "smoke" / "sgd" / "summary.json").exists()
    outcome, detail = one_line_error(r)
    if not kept:
        return "silent", "the finished record was deleted; " + detail
    return outcome, detail


def force_keeps_user_files(symlinked: bool) -> Callable:
    def run(tree: Path, tmp: Path) -> tuple[str, str]:
        runs = smoke_record(tree, tmp)
        d = runs / "smoke" / "sgd"
        if symlinked:
            real = tmp / f"elsewhere-{runs.name}"
            shutil.move(str(d), real)
            d.symlink_to(real)
        (d / "notes.txt").write_text("mine")
        r = retrain(tree, runs, "--force")
        if r is None or r.returncode:
            return one_line_error(r)
        return ("clean", "notes.txt kept") if (d / "notes.txt").exists() else ("silent", "notes.txt deleted")

    return run


def bf16_reuse(tree: Path, tmp: Path) -> tuple[str, str]:
    runs = smoke_record(tree, tmp)
    r = retrain(tree, runs, "--precision", "bf16")
    if r is None:
        return "silent", "timeout"
    if TRACE in r.stdout + r.stderr:
        return "traceback", r.stderr.strip().splitlines()[-1][:120]
    if "precision" in r.stderr.lower():
        return "clean", [x for x in r.stderr.splitlines() if "precision" in x.lower()][0][:120]
    return "silent", "fp32 record reused without a word"


def symlink_to_sibling(tree: Path, tmp: Path) -> tuple[str, str]:
    runs = Path(tempfile.mkdtemp(dir=tmp, prefix="runs-"))
    (runs / "smoke" / "sibling").mkdir(parents=True)
    (runs / "smoke" / "sgd").symlink_to(runs / "smoke" / "sibling")
    r = retrain(tree, runs)
    if r is not None and r.returncode == 0:
        return "clean", "trained through the symlink"
    return one_line_error(r)


# ------------------------------------------------------------------------------------------- launchers
def launcher_case(kind: str) -> Callable:
    def run(tree: Path, tmp: Path) -> tuple[str, str]:
        cwd = Path(tempfile.mkdtemp(dir=tmp, prefix="cwd-"))
        runs = cwd / "records"
        env = {"ATTNID_RUNS": str(runs)}
        args = ["experiments", "--profile", "smoke", "--seed", "0"]
        if kind == "no-sbatch":
            env["PATH"] = str(Path(sys.executable).parent) + ":/usr/bin:/bin"
            r = sh(tree, [*args, "--launcher", "slurm"], env=env, cwd=cwd)
            left = list(cwd.glob("*.pkl"))
            outcome, detail = one_line_error(r, "sbatch")
            return ("silent", f"left {len(left)} .pkl files in the cwd; {detail}") if left else (outcome, detail)
        if kind == "failing-sbatch":
            bindir = cwd / "bin"
            bindir.mkdir()
            for cmd in ("srun", "sacct", "scancel", "squeue"):  # the rest of SLURM is there
                (bindir / cmd).write_text("#!/bin/sh\nexit 0\n")
                (bindir / cmd).chmod(0o755)
            (bindir / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: invalid partition' >&2\nexit 1\n")
            (bindir / "sbatch").chmod(0o755)
            env["PATH"] = f"{bindir}:{os.environ['PATH']}"
            r = sh(tree, [*args, "--launcher", "slurm"], env=env, cwd=cwd)
            if r is not None:  # sbatch's own stderr reaches the terminal (submitit does not capture it)
                r.stderr = "\n".join(x for x in r.stderr.splitlines() if not x.startswith("sbatch:"))
            return one_line_error(r, "sbatch")
        if kind == "log-dir-file":
            f = cwd / "a-file"
            f.write_text("")
            return one_line_error(sh(tree, [*args, "--launcher", "local", "--log-dir", str(f)], env=env, cwd=cwd))
        # local launcher with --threads 1: every summary says 1, and no logs land in the cwd
        r = sh(tree, [*args, "--suite", "heads", "--launcher", "local", "--threads", "1"], env=env, cwd=cwd,
               timeout=600)  # fmt: skip
        if r is None or r.returncode:
            return one_line_error(r)
        threads = {json.loads(p.read_text()).get("threads") for p in runs.rglob("summary.json")}
        stray = [str(p.relative_to(cwd)) for p in cwd.rglob("*") if "submitit" in p.name and runs not in p.parents]
        if threads != {1}:
            return "silent", f"--threads 1 ignored: summaries say {sorted(map(str, threads))}"
        if stray:
            return "silent", f"logs in the cwd: {stray[0]}"
        return "clean", "threads 1 in every summary, logs under the runs folder"

    return run


# ------------------------------------------------------------------------------------------------ tools
def check_pages(target: str) -> Callable:
    def run(tree: Path, tmp: Path) -> tuple[str, str]:
        p = tmp / f"pages-{target}"
        if target == "empty":
            p.mkdir(exist_ok=True)
        elif target == "file":
            p.write_text("not a book")
        return one_line_error(sh(tree, [str(p)], tool="check_pages.py"))

    return run


def screenshots_into_a_file(tree: Path, tmp: Path) -> tuple[str, str]:
    html = tmp / "html-one-page"
    html.mkdir(exist_ok=True)
    (html / "index.html").write_text("<html><body><p>page</p></body></html>")
    f = tmp / "shots-file"
    f.write_text("")
    return one_line_error(sh(tree, [str(html), "--screenshots", str(f)], tool="check_pages.py", timeout=120))


def book_tool(which: str) -> Callable:
    def run(tree: Path, tmp: Path) -> tuple[str, str]:
        if which == "folder":
            return one_line_error(sh(tree, ["execute", "--profile", "smoke", "--out", str(tmp / "b"), str(tmp)],
                                     tool="book.py"))  # fmt: skip
        f = tmp / "out-file"
        f.write_text("")
        return one_line_error(sh(tree, ["execute", "--profile", "smoke", "--out", str(f)], tool="book.py"))

    return run


def strict_json(tree: Path, tmp: Path) -> tuple[str, str]:
    r = sh(tree, ["audit", "--embed", "32", "--heads", "4", "--bias", "all", "--json"])
    if r is None or r.returncode:
        return one_line_error(r)

    def refuse(c: str):
        raise ValueError(f"non-standard JSON constant {c}")

    try:
        json.loads(r.stdout, parse_constant=refuse)
    except ValueError as e:
        return "silent", str(e)
    return "clean", "strict JSON"


def presets_verify_progress(tree: Path, tmp: Path) -> tuple[str, str]:
    r = sh(tree, ["presets", "--verify", "--json"], timeout=900)
    if r is None or r.returncode:
        return one_line_error(r)
    json.loads(r.stdout)
    return ("clean", "progress on stderr") if "%" in r.stderr else ("silent", "no progress shown")


def hf_unbounded(tree: Path, tmp: Path) -> tuple[str, str]:
    r = sh(tree, ["audit", "--hf", "gpt2", "--embed", "128", "--heads", "4"], timeout=120)
    if r is None:
        return "silent", "no end after 120 s"
    if r.returncode == 0:
        return "clean", "finished"
    return one_line_error(r)


AUDIT = "from attnid import AttentionConfig\nfrom attnid.audit import audit\n"


def rotary_30(hf_type: str) -> Callable:
    """The real module must rotate exactly 30 of 44 dims; the truth is this checkout's closed form."""
    sys.path.insert(0, str(ROOT / "src"))
    from attnid.attention import AttentionConfig
    from attnid.counting import count

    truth = count(AttentionConfig(44, 1, bias="all", rope_dims=30)).unidentified
    return cli_count(["audit", "--hf", hf_type, "--embed", "44", "--heads", "1", "--rope-dims", "30"], truth)


CASES = [
    # data loss
    Case("--force with a 3-byte corpus keeps the finished record", "cli", force_with_bad_corpus),
    Case("--force keeps a user's notes.txt", "cli", force_keeps_user_files(False)),
    Case("--force through a symlinked run folder keeps notes.txt", "cli", force_keeps_user_files(True)),
    # damaged records
    Case("summary without its files list", "cli", damaged(edit_summary(lambda s: s.pop("files")))),
    Case("summary with files = {}", "cli", damaged(edit_summary(lambda s: s.update(files={})))),
    Case("summary with an edited final_val_loss", "cli", damaged(edit_summary(lambda s: s.update(final_val_loss=0.1)))),
    Case("summary with an edited steps", "cli", damaged(edit_summary(lambda s: s.update(steps=7)))),
    Case("summary with format 99", "cli", damaged(edit_summary(lambda s: s.update(format=99)))),
    Case('summary with format "2"', "cli", damaged(edit_summary(lambda s: s.update(format="2")))),
    Case("summary with files as a list", "cli", damaged(edit_summary(lambda s: s.update(files=list(s["files"]))))),
    Case(
        "a files entry without bytes",
        "cli",
        damaged(edit_summary(lambda s: next(iter(s["files"].values())).pop("bytes"))),
    ),  # fmt: skip
    Case("metrics replaced by a valid gzip of [1,2,3]", "cli", damaged(metrics_as_list)),
    # silent wrong counts
    Case(
        "RoPE audit with D > E and L = 2",
        "cli",
        cli_count(
            ["audit", "--embed", "4", "--heads", "1", "--head-dim", "8", "--rope", "--seq-len", "2", "--batch", "16"],
            56,
        ),
    ),  # fmt: skip
    *[Case(f"{t} at E = 44, H = 1, R = 30", "cli", rotary_30(t)) for t in ("gpt_neox", "phi")],
    Case(
        "audit_torch_mha(batch=1)",
        "api",
        api(
            "import torch\nfrom attnid.audit import audit_torch_mha\n"
            "r = audit_torch_mha(torch.nn.MultiheadAttention(8, 2), batch=1)",
            check="r.unidentified == 80",
        ),
    ),
    Case(
        "audit_torch_mha(seq_len=1)",
        "api",
        api(
            "import torch\nfrom attnid.audit import audit_torch_mha\n"
            "r = audit_torch_mha(torch.nn.MultiheadAttention(8, 2), seq_len=1)",
            check="r.unidentified == 80",
        ),
    ),
    Case(
        "audit_module with all-zero inputs",
        "api",
        api(
            "import torch\nfrom attnid.audit import audit_module\n"
            "r = audit_module(torch.nn.MultiheadAttention(8, 2, batch_first=True), (torch.zeros(2, 8, 8),) * 3)",
            check="r.unidentified == 80",
        ),
    ),
    Case(
        "count with rope_base = 1",
        "api",
        api(
            "from attnid import AttentionConfig, count\nc = count(AttentionConfig(8, 2, rope=True, rope_base=1.0))",
            check="c.unidentified == 48",
        ),
    ),
    *[
        Case(
            f"rope_base = {b}",
            "api",
            api(
                f"from attnid import AttentionConfig\nAttentionConfig(8, 2, rope=True, rope_base={b})",
                error="rope_base",
            ),
        )  # fmt: skip
        for b in ("0.0", "float('nan')", "-2.0")
    ],
    Case(
        "audit(rtol=1e-300)",
        "api",
        api(
            "from attnid import AttentionConfig\nfrom attnid.audit import audit\n"
            "r = audit(AttentionConfig(8, 2, bias='all'), rtol=1e-300)",
            check="r.unidentified == 80",
        ),
    ),
    Case(
        "audit(rtol=0.5)",
        "api",
        api(
            "from attnid import AttentionConfig\nfrom attnid.audit import audit\n"
            "r = audit(AttentionConfig(8, 2, bias='all'), rtol=0.5)",
            check="r.unidentified == 80",
        ),
    ),
    # inputs silently ignored or replaced
    Case("--hf llama --embed 0", "cli", cli_error("audit", "--hf", "llama", "--embed", "0", words=("embed",))),
    Case("--hf gpt2 --heads 0", "cli", cli_error("audit", "--hf", "gpt2", "--heads", "0", words=("heads",))),
    Case(
        "--hf '' --embed 8 --heads 2",
        "cli",
        cli_error("audit", "--hf", "", "--embed", "8", "--heads", "2", words=("hf",)),
    ),  # fmt: skip
    Case("--max-memory with --hf", "cli", cli_error("audit", "--hf", "gpt2", "--max-memory", "0.001")),
    Case("--max-memory nan", "cli", cli_error("audit", "--embed", "8", "--heads", "2", "--max-memory", "nan")),
    Case("--max-memory -1", "cli", cli_error("audit", "--embed", "8", "--heads", "2", "--max-memory", "-1")),
    Case("--seq-len 0", "cli", cli_error("audit", "--embed", "8", "--heads", "2", "--seq-len", "0")),
    Case("presets --threads -3", "cli", cli_error("presets", "--threads", "-3", words=("threads",))),
    Case("experiments --launcher local --threads 1", "cli", launcher_case("threads")),
    Case("train --precision bf16 over an fp32 record", "cli", bf16_reuse),
    Case(
        "AttentionConfig(True, True)",
        "api",
        api("from attnid import AttentionConfig\nAttentionConfig(True, True)", error="embed"),
    ),
    Case(
        "AttentionConfig(groups=True)",
        "api",
        api("from attnid import AttentionConfig\nAttentionConfig(8, 2, groups=True)", error="groups"),
    ),
    Case(
        "--hf llama --head-dim 3 blames head_dim",
        "cli",
        cli_error(
            "audit",
            "--hf",
            "llama",
            "--embed",
            "8",
            "--heads",
            "2",
            "--head-dim",
            "3",
            words=("head_dim",),
            absent=("rope_dims",),
        ),  # fmt: skip
    ),
    # unbounded work
    Case("--hf gpt2 --embed 128 --heads 4", "cli", hf_unbounded),
    Case("presets --verify --json shows progress", "cli", presets_verify_progress),
    # machine output and automation
    Case("audit --json is strict JSON (E = 32, certify)", "cli", strict_json),
    *[Case(f"check_pages on a {t} target fails", "cli", check_pages(t)) for t in ("missing", "empty", "file")],
    # tracebacks
    Case("slurm launcher without sbatch", "cli", launcher_case("no-sbatch")),
    Case("a failing sbatch", "cli", launcher_case("failing-sbatch")),
    Case("--log-dir pointing at a file", "cli", launcher_case("log-dir-file")),
    Case("a run folder that is a symlink to a sibling", "cli", symlink_to_sibling),
    Case("check_pages --screenshots <a file>", "cli", screenshots_into_a_file),
    Case("book.py execute <a folder>", "cli", book_tool("folder")),
    Case("book.py --out <a file>", "cli", book_tool("file")),
    Case(
        "audit(seq_len=2.5)",
        "api",
        api(
            AUDIT + "audit(AttentionConfig(8, 2), seq_len=2.5)",
            error="seq_len",
        ),
    ),  # fmt: skip
    Case(
        "audit(seed='a')",
        "api",
        api(
            AUDIT + "audit(AttentionConfig(8, 2), seed='a')",
            error="seed",
        ),
    ),  # fmt: skip
    Case(
        "audit_module(a non-module)",
        "api",
        api(
            "import torch\nfrom attnid.audit import audit_module\naudit_module('layer', (torch.randn(2, 4),))",
            error="module",
        ),
    ),
    Case(
        "audit_torch_mha(a kdim MHA)",
        "api",
        api(
            "import torch\nfrom attnid.audit import audit_torch_mha\n"
            "audit_torch_mha(torch.nn.MultiheadAttention(8, 2, kdim=4, vdim=4))",
            error="kdim",
        ),
    ),
    Case(
        "audit_hf(attn_implementation='bogus')",
        "api",
        api(
            "from attnid.hf import audit_hf\naudit_hf('llama', embed=8, heads=2, attn_implementation='bogus')",
            error="attn_implementation",
        ),
    ),
    Case(
        "audit_module with non-finite inputs",
        "api",
        api(
            "import torch\nfrom attnid.audit import audit_module\n"
            "audit_module(torch.nn.Linear(4, 4), (torch.full((3, 4), float('nan')),))",
            error="inputs",
        ),
    ),
    # side effects
    Case(
        "audit_module leaves the caller's module float32",
        "api",
        api(
            "import torch\nfrom attnid.audit import audit_module\nm = torch.nn.Linear(4, 3)\n"
            "audit_module(m, (torch.randn(5, 4),))",
            check="m.weight.dtype == torch.float32",
        ),
    ),
    Case(
        "audit_torch_mha leaves the caller's module float32",
        "api",
        api(
            "import torch\nfrom attnid.audit import audit_torch_mha\nm = torch.nn.MultiheadAttention(8, 2)\n"
            "audit_torch_mha(m)",
            check="m.in_proj_weight.dtype == torch.float32",
        ),
    ),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose src/ and tools/ are tested")
    ap.add_argument("--only", help="run the cases whose name contains this")
    ap.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    a = ap.parse_args(argv)
    tree = a.tree.resolve()
    if not (tree / "src" / "attnid").is_dir():
        ap.error(f"--tree {tree}: no src/attnid there")
    cases = [c for c in CASES if not a.only or a.only in c.name]
    if not cases:
        ap.error(f"--only {a.only!r}: no case matches")
    results = []
    with tempfile.TemporaryDirectory(prefix="attnid-redteam-") as scratch:
        for c in cases:
            try:  # one scratch folder: the trained record is reused across cases
                outcome, detail = c.run(tree, Path(scratch))
            except Exception as e:  # a broken case setup: report it, go on
                outcome, detail = "setup failed", f"{type(e).__name__}: {e}"[:150]
            results.append({"case": c.name, "kind": c.kind, "outcome": outcome, "detail": detail})
            if not a.json:
                print(f"{outcome:>12}  {c.kind:<4} {c.name}: {detail}", flush=True)
    if a.json:
        print(json.dumps(results, indent=2))
        return 0
    table = Counter((r["kind"], r["outcome"]) for r in results)
    print(f"\n{'outcome':<14}{'CLI, tools, faults':>20}{'Python API':>12}")
    for outcome in ("clean", "traceback", "silent", "setup failed"):
        if any(k[1] == outcome for k in table):
            print(f"{outcome:<14}{table['cli', outcome]:>20}{table['api', outcome]:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
