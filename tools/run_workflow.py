"""Run a GitHub workflow's steps here, in a fresh clone, in order: a workflow change is tried before it is pushed.

    python tools/run_workflow.py .github/workflows/book.yml [--job build] [--keep] [--env PROFILE=smoke]

Each job's ``run`` steps run with bash (``-eo pipefail``, as on GitHub's runners) in a fresh clone of this
repository's HEAD (what is committed: the point is to catch a missing file or step), with the workflow's, job's and
step's ``env`` and the ``${{ }}`` expressions of the ``github``, ``runner``, ``env`` and ``inputs`` contexts filled in
locally (``github.ref`` is ``refs/heads/local``, so a step that only runs on ``main``, such as a push, is skipped).
The actions have local equivalents: ``checkout`` is the clone itself, ``setup-python`` and ``cache`` do nothing (this
python3; a cold cache), ``upload-pages-artifact`` and ``upload-artifact`` check that their path exists (as the
upload would), ``deploy-pages`` is skipped. An action without an equivalent, or a step that fails, stops the run
(exit status 1); every step's outcome is listed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def context(clone: Path, inputs: dict[str, str]) -> dict[str, str]:
    """The values the ``${{ }}`` expressions may name, locally."""
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    origin = subprocess.run(["git", "remote", "get-url", "origin"], cwd=ROOT, capture_output=True, text=True)
    repo = re.sub(r"^.*github\.com[:/]|\.git$", "", origin.stdout.strip()) if "github.com" in origin.stdout else ""
    return {
        "github.sha": sha, "github.ref": "refs/heads/local", "github.ref_name": "local", "github.ref_type": "branch",
        "github.event_name": "workflow_dispatch",
        "github.repository": repo or "attnid/attnid", "github.server_url": "https://github.com",
        "github.token": "", "github.run_number": "0", "runner.os": "Linux",
        **{f"inputs.{k}": v for k, v in inputs.items()},
    }  # fmt: skip


def hash_files(clone: Path, pattern: str) -> str:
    h = hashlib.sha256()
    for p in sorted(clone.glob(pattern)):
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def evaluate(expr: str, ctx: dict[str, str], env: dict[str, str], clone: Path) -> str:
    """One expression: a context value, ``env.X``, ``hashFiles('...')``, or a comparison with ``==``/``!=``
    (``'true'``/``'false'``); ``always()`` and ``success()`` are true here. Anything else raises ``ValueError``."""
    expr = expr.strip()
    if expr in ("always()", "success()"):
        return "true"
    for op in ("==", "!="):
        if op in expr:
            a, b = (evaluate(x, ctx, env, clone) for x in expr.split(op, 1))
            return "true" if (a == b) == (op == "==") else "false"
    if expr.startswith("'") and expr.endswith("'"):
        return expr[1:-1]
    if m := re.fullmatch(r"hashFiles\('([^']+)'\)", expr):
        return hash_files(clone, m.group(1))
    if expr.startswith("env."):
        return env.get(expr[4:], "")
    if expr in ctx or expr.startswith("steps."):
        return ctx.get(expr, "")
    raise ValueError(f"no local value for the expression {expr!r}")


def fill(text, ctx: dict[str, str], env: dict[str, str], clone: Path) -> str:
    return EXPR.sub(lambda m: evaluate(m.group(1), ctx, env, clone), str(text))


def local_action(uses: str, with_: dict, clone: Path) -> tuple[bool, str]:
    """What an action does here: ``(ok, what happened)``; unknown actions are not ok."""
    name = uses.split("@", 1)[0]
    if name in ("actions/checkout", "actions/setup-python", "actions/cache"):
        return True, f"{name}: the fresh clone and this python3 stand in for it"
    if name == "actions/deploy-pages":
        return True, "deploy-pages: skipped (nothing is published from here)"
    if name in ("actions/upload-pages-artifact", "actions/upload-artifact"):
        paths = [p for p in str(with_.get("path", "")).splitlines() if p.strip()]
        missing = [p for p in paths if not (clone / p.strip()).exists()]
        if missing and not (name == "actions/upload-artifact" and with_.get("if-no-files-found") in ("warn", "ignore")):
            return False, f"{name}: nothing at {', '.join(missing)} to upload"
        size = sum(
            f.stat().st_size
            for p in paths
            if (clone / p.strip()).exists()
            for f in (clone / p.strip()).rglob("*")
            if f.is_file()
        )
        return True, f"{name}: {', '.join(paths)} holds {size / 2**20:.1f} MiB" + (
            " (missing: warned)" if missing else ""
        )
    return False, f"{uses}: no local equivalent; run this workflow on GitHub"


def run_job(name: str, job: dict, workflow: dict, clone: Path, ctx: dict[str, str], extra: dict[str, str]) -> list[str]:
    """The job's steps in order; returns one outcome line per step, the last starting with FAILED if one failed.
    Long because it is the runner's loop: conditions, environments, actions and shell steps."""
    outcomes = []
    env = {**os.environ, **{k: fill(v, ctx, {}, clone) for k, v in (workflow.get("env") or {}).items()}}
    env.update({k: fill(v, ctx, env, clone) for k, v in (job.get("env") or {}).items()})
    env.update(extra)
    for i, step in enumerate(job.get("steps", []), 1):
        label = step.get("name") or step.get("uses") or f"step {i}"
        cond = step.get("if")
        if cond is not None and evaluate(EXPR.sub(lambda m: m.group(1), str(cond)), ctx, env, clone) != "true":
            outcomes.append(f"skipped  {label} (if: {cond})")
            continue
        step_env = {**env, **{k: fill(v, ctx, env, clone) for k, v in (step.get("env") or {}).items()}}
        if "uses" in step:
            ok, what = local_action(step["uses"], step.get("with") or {}, clone)
            outcomes.append(("ok       " if ok else "FAILED   ") + what)
            if not ok:
                return outcomes
            continue
        script = fill(step["run"], ctx, step_env, clone)
        print(f"\n== {name}: {label}\n{script}", flush=True)
        r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=clone, env=step_env)
        outcomes.append(("ok       " if r.returncode == 0 else f"FAILED   (exit {r.returncode}) ") + label)
        if r.returncode:
            return outcomes
    return outcomes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workflow", type=Path, help="a workflow file, e.g. .github/workflows/book.yml")
    ap.add_argument("--job", action="append", help="run only this job (repeatable; default: every job, in order)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="set or override a variable")
    ap.add_argument("--input", action="append", default=[], metavar="K=V", help="a workflow_dispatch input")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="the git repository to clone (default: this one)")
    a = ap.parse_args(argv)
    workflow = yaml.safe_load(a.workflow.read_text())
    pairs = [kv.split("=", 1) for kv in [*a.env, *a.input]]
    if any(len(p) != 2 for p in pairs):
        raise SystemExit("run_workflow: --env and --input take K=V")
    extra, inputs = dict(p for p in (kv.split("=", 1) for kv in a.env)), dict(kv.split("=", 1) for kv in a.input)
    jobs = {k: v for k, v in workflow["jobs"].items() if not a.job or k in a.job}
    tmp = Path(tempfile.mkdtemp(prefix="workflow-"))
    clone = tmp / a.repo.resolve().name
    subprocess.run(["git", "clone", "-q", str(a.repo), str(clone)], check=True)
    ctx = context(clone, inputs)
    failed = False
    for name, job in jobs.items():
        outcomes = run_job(name, job, workflow, clone, ctx, extra)
        print(f"\n== job {name}:\n" + "\n".join(f"  {o}" for o in outcomes), flush=True)
        failed = failed or any(o.startswith("FAILED") for o in outcomes)
        if failed:
            break
    print(f"clone: {clone}" if a.keep or failed else f"clone removed: {clone}")
    if not (a.keep or failed):
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
