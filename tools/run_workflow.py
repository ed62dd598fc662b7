"""Run a GitHub workflow's steps here, in a fresh clone, in order: a workflow change is tried before it is pushed.

    python tools/run_workflow.py .github/workflows/book.yml [--job build] [--keep] [--env PROFILE=smoke]

Each job's ``run`` steps run with bash (``-eo pipefail``, as on GitHub's runners) in a fresh clone of this
repository's HEAD (what is committed: the point is to catch a missing file or step), with the workflow's, job's and
step's ``env`` and the ``${{ }}`` expressions of the ``github``, ``runner``, ``env`` and ``inputs`` contexts filled in
locally (``github.ref`` is ``refs/heads/local``, so a step that only runs on ``main``, such as a push, is skipped).
The actions have local equivalents: ``checkout`` is the clone itself, ``setup-python`` and ``cache`` do nothing (this
python3; a cold cache), ``upload-pages-artifact`` and ``upload-artifact`` check that their path exists (as the
upload would), ``deploy-pages`` is skipped. An action without an equivalent, or a step that fails, stops the run
(exit status 1); every step's outcome is listed at the end. Jobs run in an order their ``needs`` allow; a step's
``working-directory`` and ``shell: bash`` are honoured. What the runner does not emulate (another shell, an
expression function, a key of a step or job it does not know) is refused by name before or as it is met (exit
status 2), and its clone removed. A ``git push`` in a step fails unless ``--allow-push``: the clone's push address is
disabled, so that a workflow never writes into the repository it was cloned from. An ``--input`` value is pasted
into the script as GitHub pastes it, so it may hold no shell syntax.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
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


class Unsupported(ValueError):
    """A construct the runner does not emulate (an expression, a step key, a shell): named, in one line, exit 2."""


def _split_top(expr: str, op: str) -> list[str]:
    """``expr`` split on ``op`` outside quotes and parentheses."""
    parts, depth, quoted, start, i = [], 0, False, 0, 0
    while i < len(expr):
        ch = expr[i]
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch in "()":
            depth += 1 if ch == "(" else -1
        elif not quoted and depth == 0 and expr.startswith(op, i):
            parts.append(expr[start:i])
            i += len(op)
            start = i
            continue
        i += 1
    return [*parts, expr[start:]]


def _wrapped(expr: str) -> bool:
    """Whether ``expr`` is one parenthesised expression: its first ``(`` closes at its last character."""
    if not (expr.startswith("(") and expr.endswith(")")):
        return False
    depth, quoted = 0, False
    for i, ch in enumerate(expr):
        quoted = quoted != (ch == "'")
        if not quoted:
            depth += (ch == "(") - (ch == ")")
            if depth == 0 and i < len(expr) - 1:
                return False
    return True


def _truthy(value: str) -> bool:
    return value not in ("", "false", "0")


def evaluate(expr: str, ctx: dict[str, str], env: dict[str, str], clone: Path) -> str:
    """One expression: a context value, ``env.X``, ``hashFiles('...')``, a string literal, ``!``, a comparison with
    ``==``/``!=`` and their combinations with ``&&`` and ``||`` (GitHub's: the first falsy or truthy operand),
    parentheses; ``always()`` and ``success()`` are true here. Anything else raises :class:`Unsupported`."""
    expr = expr.strip()
    while _wrapped(expr):
        expr = expr[1:-1].strip()
    for op in ("||", "&&"):
        parts = _split_top(expr, op)
        if len(parts) > 1:
            values = [evaluate(x, ctx, env, clone) for x in parts]
            pick = next((v for v in values if _truthy(v) == (op == "||")), values[-1])
            return pick
    for op in ("==", "!="):
        parts = _split_top(expr, op)
        if len(parts) == 2:
            a, b = (evaluate(x, ctx, env, clone) for x in parts)
            return "true" if (a == b) == (op == "==") else "false"
    if expr.startswith("!") and not expr.startswith("!="):
        return "false" if _truthy(evaluate(expr[1:], ctx, env, clone)) else "true"
    return _leaf(expr, ctx, env, clone)


def _leaf(expr: str, ctx: dict[str, str], env: dict[str, str], clone: Path) -> str:
    """An expression without operators: a literal, a function the runner knows, or a context value."""
    if expr in ("always()", "success()"):
        return "true"
    if expr.startswith("'") and expr.endswith("'") and len(expr) >= 2:
        return expr[1:-1]
    if m := re.fullmatch(r"hashFiles\('([^']+)'\)", expr):
        return hash_files(clone, m.group(1))
    if expr.startswith("env."):
        return env.get(expr[4:], "")
    if expr in ("true", "false"):
        return expr
    if expr in ctx or expr.startswith("steps."):
        return ctx.get(expr, "")
    raise Unsupported(f"the expression {expr!r} has no local value here; run this workflow on GitHub")


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


STEP_KEYS = {"name", "id", "run", "uses", "with", "env", "if", "working-directory", "shell", "timeout-minutes"}
JOB_KEYS = {"runs-on", "timeout-minutes", "env", "steps", "needs", "if", "permissions", "environment", "defaults",
            "concurrency", "name", "outputs"}  # fmt: skip
SAFE_INPUT = re.compile(r"[A-Za-z0-9._:/=,+@-]*")  # an --input value pasted into a script: no shell syntax in it


def _check_step(step: dict, label: str, defaults: dict) -> tuple[str, Path | None]:
    """The shell and working folder of a step; :class:`Unsupported` for a key or a shell the runner does not emulate."""
    unknown = sorted(set(step) - STEP_KEYS)
    if unknown:
        raise Unsupported(f"step {label!r}: {', '.join(unknown)} not emulated here; run this workflow on GitHub")
    shell = step.get("shell", defaults.get("shell", "bash"))
    if shell != "bash":
        raise Unsupported(f"step {label!r}: shell {shell!r} not emulated here (bash only)")
    where = step.get("working-directory", defaults.get("working-directory"))
    return shell, None if where is None else Path(where)


def run_job(name: str, job: dict, workflow: dict, clone: Path, ctx: dict[str, str], extra: dict[str, str]) -> list[str]:
    """The job's steps in order; returns one outcome line per step, the last starting with FAILED if one failed.
    Long because it is the runner's loop: conditions, environments, actions and shell steps."""
    unknown = sorted(set(job) - JOB_KEYS)
    if unknown:
        raise Unsupported(f"job {name!r}: {', '.join(unknown)} not emulated here; run this workflow on GitHub")
    outcomes = []
    defaults = {**((workflow.get("defaults") or {}).get("run") or {}), **((job.get("defaults") or {}).get("run") or {})}
    env = {**os.environ, **{k: fill(v, ctx, {}, clone) for k, v in (workflow.get("env") or {}).items()}}
    env.update({k: fill(v, ctx, env, clone) for k, v in (job.get("env") or {}).items()})
    env.update(extra)
    for i, step in enumerate(job.get("steps", []), 1):
        label = step.get("name") or step.get("uses") or f"step {i}"
        _, where = _check_step(step, label, defaults)
        cond = step.get("if")
        if cond is not None and evaluate(EXPR.sub(lambda m: m.group(1), str(cond)), ctx, env, clone) != "true":
            outcomes.append(f"skipped  {label} (if: {cond})")
            continue
        step_env = {**env, **{k: fill(v, ctx, env, clone) for k, v in (step.get("env") or {}).items()}}
        if "uses" in step:  # its inputs filled as GitHub fills them (an upload's path may name ${{ env.PROFILE }})
            with_ = {k: fill(v, ctx, step_env, clone) for k, v in (step.get("with") or {}).items()}
            ok, what = local_action(step["uses"], with_, clone)
            outcomes.append(("ok       " if ok else "FAILED   ") + what)
            if not ok:
                return outcomes
            continue
        script = fill(step["run"], ctx, step_env, clone)
        cwd = clone if where is None else clone / fill(str(where), ctx, step_env, clone)
        print(f"\n== {name}: {label}\n{script}", flush=True)
        r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd, env=step_env)
        outcomes.append(("ok       " if r.returncode == 0 else f"FAILED   (exit {r.returncode}) ") + label)
        if r.returncode:
            return outcomes
    return outcomes


def job_order(jobs: dict, chosen: list[str] | None) -> list[str]:
    """The jobs in an order their ``needs`` allow (each after those it needs); with ``chosen``, those and what they
    need is not run: a chosen job that needs an unchosen one is refused."""
    names = [k for k in jobs if not chosen or k in chosen]
    order: list[str] = []
    while len(order) < len(names):
        ready = [k for k in names if k not in order and all(n in order for n in _needs(jobs[k]))]
        if not ready:
            left = [k for k in names if k not in order]
            missing = {n for k in left for n in _needs(jobs[k]) if n not in names}
            why = f"needs {', '.join(sorted(missing))}, not run here" if missing else "their needs form a cycle"
            raise Unsupported(f"jobs {', '.join(left)}: {why}")
        order.append(ready[0])
    return order


def _needs(job: dict) -> list[str]:
    needs = job.get("needs") or []
    return [needs] if isinstance(needs, str) else list(needs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workflow", type=Path, help="a workflow file, e.g. .github/workflows/book.yml")
    ap.add_argument("--job", action="append", help="run only this job (repeatable; default: every job, in order)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="set or override a variable")
    ap.add_argument("--input", action="append", default=[], metavar="K=V", help="a workflow_dispatch input")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="the git repository to clone (default: this one)")
    ap.add_argument("--allow-push", action="store_true",
                    help="let a step's `git push` reach the cloned repository (default: every push fails)")  # fmt: skip
    a = ap.parse_args(argv)
    workflow = yaml.safe_load(a.workflow.read_text())
    pairs = [kv.split("=", 1) for kv in [*a.env, *a.input]]
    if any(len(p) != 2 for p in pairs):
        raise SystemExit("run_workflow: --env and --input take K=V")
    extra, inputs = dict(p for p in (kv.split("=", 1) for kv in a.env)), dict(kv.split("=", 1) for kv in a.input)
    unsafe = [k for k, v in inputs.items() if not SAFE_INPUT.fullmatch(v)]
    if unsafe:  # GitHub pastes an input into the script as it is: shell syntax in it would run here
        print(f"run_workflow: --input {', '.join(unsafe)}: letters, digits and ._:/=,+@- only", file=sys.stderr)
        return 2
    try:
        order = job_order(workflow["jobs"], a.job)
    except Unsupported as e:
        print(f"run_workflow: {e}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="workflow-"))
    clone = tmp / a.repo.resolve().name
    failed = refused = False
    try:
        subprocess.run(["git", "clone", "-q", str(a.repo), str(clone)], check=True)
        if not a.allow_push:  # a step's `git push` must not write into the repository cloned (your own checkout)
            subprocess.run(["git", "-C", str(clone), "remote", "set-url", "--push", "origin", "no-push:disabled"],
                           check=True)  # fmt: skip
        ctx = context(clone, inputs)
        for name in order:
            outcomes = run_job(name, workflow["jobs"][name], workflow, clone, ctx, extra)
            print(f"\n== job {name}:\n" + "\n".join(f"  {o}" for o in outcomes), flush=True)
            failed = failed or any(o.startswith("FAILED") for o in outcomes)
            if failed:
                break
    except Unsupported as e:
        print(f"run_workflow: {e}", file=sys.stderr)
        refused = True
    finally:
        keep = (a.keep or failed) and not refused
        print(f"clone: {clone}" if keep else f"clone removed: {clone}", flush=True)
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 2 if refused else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
