"""Book pipeline (not part of the attnid package): execute chapters with papermill, cache by
content hash, write the reproducibility page, build the Jupyter Book strictly.

    python tools/book.py build   [--profile cpu] [--device auto] [--seed 0] [--out build/cpu]
    python tools/book.py execute [--profile ...] [--jobs N] [notebooks/03_biases.py ...]
    python tools/book.py serve   [--out build/cpu] [--port 8000]

Chapter sources are jupytext percent files ``notebooks/*.py``. Each is converted one way to
``.ipynb`` and executed into ``<out>/_generated/``; a chapter is re-executed only when the hash
of its source, its parameters, every file under ``src/`` or the run records it reads changes
(each record's ``summary.json`` and the files it lists, so adding, removing, remaking or damaging a
record counts). The runs a chapter's module trains and reads (its ``READS``) are trained here first
(:func:`train_before`), so a chapter reads records that it does not change; on a cold cpu build they are trained by
a child process while the chapters that read none of them execute, and each chapter that reads them waits for its
own (:func:`plan_ahead`, :class:`TrainingAhead`). The records' digest is taken
before and after a chapter runs: a chapter whose records changed while it ran (another process trained
them) is executed once more at once, and is stamped only when the records it read are the ones there
after it.

A dead kernel fails its chapter (named) and the others go on. A kernel that dies before it answers its
first request has run none of the chapter; it is started again, up to ``KERNEL_START_TRIES`` times (kernels
started side by side can race for the same free port, papermill issue 511). SIGTERM or Ctrl-C stops the
workers and their kernels, stamps nothing unfinished and exits with one line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from attnid.lm import records
from attnid.lm.profiles import PROFILES, resolve_device

ROOT = Path(__file__).resolve().parent.parent
BOOK_SRC = ROOT / "book"
NOTEBOOKS = ROOT / "notebooks"
HIDDEN_TAGS = {"parameters", "injected-parameters"}


def chapters() -> list[Path]:
    """Chapter sources in book order: numbered chapters, then the template."""
    numbered = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.py"))
    template = NOTEBOOKS / "template_experiment.py"
    return numbered + ([template] if template.exists() else [])


def tree_hash(src_dir: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(src_dir.rglob("*")):
        if (
            p.is_file()
            and "__pycache__" not in p.parts
            and not p.name.endswith(".egg-info")
            and ".egg-info" not in str(p)
        ):
            h.update(str(p.relative_to(src_dir)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def suites_read(text: str) -> set[str]:
    """The suites a chapter's source reads: those it names (``"dynamics"``, ``"heads"``) where it calls
    ``load_suite``, and those of :func:`suites_trained`."""
    from attnid.lm.profiles import SUITES

    return {name for name in SUITES if "load_suite(" in text and f'"{name}"' in text} | suites_trained(text)


def suites_trained(text: str) -> set[str]:
    """The ``READS`` of every chapter module a chapter's source imports (``from attnid.chapters import
    dynamics as ch``): the suites that module reads, which the chapter trains first where it can
    (``attnid.lm.launch.train_suites``)."""
    import importlib
    import importlib.util

    read = set()
    for line in re.findall(r"^from attnid\.chapters import (.+)$", text, flags=re.M):
        for name in (part.split(" as ")[0].strip() for part in line.strip("()").split(",")):
            if importlib.util.find_spec(f"attnid.chapters.{name}") is not None:
                read |= set(getattr(importlib.import_module(f"attnid.chapters.{name}"), "READS", ()))
    return read


def train_before(nb: Path, params: dict) -> None:
    """Train the runs the chapter's loader would train (:func:`suites_trained`, by the rule of
    ``attnid.lm.launch.train_suites``) before its kernel starts: the chapter then reads records that do not
    change while it runs, and is executed once, not once more for records it made itself."""
    trained = sorted(suites_trained(nb.read_text()))
    if not trained:
        return
    from attnid.lm.launch import train_suites

    def report(message: str) -> None:
        print(f"    trained {message}  (read by {shown(nb)})", flush=True)

    train_suites(params.get("profile", "cpu"), trained, params.get("device", "auto"), report=report)


def plan_ahead(todo: list[Path], params: dict) -> tuple[list[str], list[Path]]:
    """What to train in the background, and the order in which to execute ``todo``: the suites that its chapters
    train (:func:`suites_trained`) with runs still to train, where those runs train as processes of their own (on
    the CPU, beyond the smoke profile); and ``todo`` with the chapters that read none of them first, so that they
    execute while those runs train. The chapters that read them follow, those whose runs cost least first
    (:func:`attnid.lm.launch.relative_cost`), each as soon as its own runs are trained; the suites are listed in that
    order of need, in which they train (each suite's longest runs first). ``([], todo)`` where nothing would train
    beside a chapter."""
    from attnid.lm.launch import relative_cost, suite_configs, trains_here, trains_in_processes

    profile, device = params.get("profile", "cpu"), params.get("device", "auto")
    if not (trains_here(profile, device) and trains_in_processes(profile, device)):
        return [], todo
    wanted = sorted(set().union(*(suites_trained(nb.read_text()) for nb in todo)))
    cost = {name: sum(map(relative_cost, suite_configs(profile, name, device=device))) for name in wanted}
    cost = {name: c for name, c in cost.items() if c > 0}
    needs = {nb: sorted(suites_read(nb.read_text()) & set(cost), key=cost.__getitem__) for nb in todo}
    waiting = sorted((nb for nb in todo if needs[nb]), key=lambda nb: sum(cost[n] for n in needs[nb]))
    free = [nb for nb in todo if not needs[nb]]
    if not cost or not free:
        return [], todo
    return list(dict.fromkeys(name for nb in waiting for name in needs[nb])), free + waiting


class TrainingAhead:
    """The runs of ``suites`` trained by a child process (:func:`attnid.lm.launch.train_in_background`: suite after
    suite in the order given, each suite's longest runs first, in one-thread worker processes) while the chapters
    that read none of them execute: on 2 cores a cold cpu book's chapters 0-5, 8 and 9 then cost little time of
    their own. :meth:`wait_for` before a chapter that reads some of them; :meth:`stop` on a stop (SIGTERM to the
    child, which stops its runs)."""

    def __init__(self, profile: str, suites: list[str], device: str):
        import multiprocessing

        from attnid.lm.launch import train_in_background

        self.profile, self.device, self.suites, self.started = profile, device, suites, time.perf_counter()
        ctx = multiprocessing.get_context("spawn")
        self.proc: multiprocessing.process.BaseProcess | None = ctx.Process(
            target=train_in_background, args=(profile, suites, device), name="attnid-training-ahead"
        )
        self.proc.start()
        print(f"  training the runs of {', '.join(suites)} in the background", flush=True)

    def wait_for(self, names: list[str]) -> None:
        """Wait until the runs of the suites ``names`` are trained (their records finished) or the training has
        ended. A failure is said in one line, once; the chapters that read the runs then train what is missing
        themselves (:func:`train_before`) and fail with its reason."""
        from attnid.lm.launch import suite_configs

        if self.proc is None:
            return
        t = time.perf_counter()
        while self.proc.is_alive() and any(suite_configs(self.profile, n, device=self.device) for n in names):
            self.proc.join(1.0)  # the records checked once a second: the runs take minutes
        took, waited = time.perf_counter() - self.started, time.perf_counter() - t
        done = f"the runs of {', '.join(names)} in the background ({took:.1f} s since the start; waited {waited:.1f} s)"
        if self.proc.is_alive() or self.proc.exitcode == 0:
            print(f"  trained    {done}", flush=True)
        if not self.proc.is_alive():
            if self.proc.exitcode != 0:
                print(f"  training in the background ended with status {self.proc.exitcode}: the chapters that read "
                      "its runs train what is missing themselves", flush=True)  # fmt: skip
            self.proc = None

    def stop(self, grace_s: float = 60.0) -> None:
        """Stop the training (SIGTERM: the child stops its jobs and waits for them), killed after ``grace_s``."""
        if self.proc is None:
            return
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(grace_s)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        self.proc = None


def records_digest(profiles: list[str], cases: list[str], roots: list[Path] | None = None) -> str:
    """sha256 over every finished record of ``cases`` (any seed) at ``profiles`` under ``roots`` (default: each
    profile's :func:`attnid.lm.records.record_roots`): its ``summary.json`` and the bytes of every file the summary
    lists except weights (``*.pt``), so it changes when a record is added, removed or remade, and when a file of one
    is truncated or replaced. The book's cache uses it for the chapters that read records."""
    h = hashlib.sha256()
    for profile in dict.fromkeys(profiles):
        for root in records.record_roots(profile) if roots is None else dict.fromkeys(roots):
            folder = Path(root) / profile
            if not folder.is_dir():
                continue
            for d in sorted(folder.iterdir()):
                name, _, seed = d.name.partition("-s")
                if name in cases and (not seed or seed.isdigit()) and (d / "summary.json").is_file():
                    summary = (d / "summary.json").read_bytes()
                    h.update(f"{profile}/{d.name}\n".encode())
                    h.update(summary)
                    try:
                        listed = json.loads(summary).get("files", {})
                    except (ValueError, AttributeError):
                        listed = {}
                    for f in sorted(listed) if isinstance(listed, dict) else []:
                        p = d / f
                        if not f.endswith(".pt") and p.is_file():
                            h.update(f.encode())
                            h.update(p.read_bytes())
    return h.hexdigest()


def records_read(nb: Path, profile: str) -> str:
    """The digest of the run records a chapter reads (:func:`suites_read`), at its profile and at the committed
    mid and paper scales; empty for a chapter that reads none."""
    read = suites_read(nb.read_text())
    if not read:
        return ""
    from attnid.lm.profiles import SUITES

    profiles = list(dict.fromkeys([profile, "mid", "paper"]))
    return records_digest(profiles, [c for name in sorted(read) for c in SUITES[name].cases])


def chapter_hash(nb: Path, params: dict, src_digest: str, read_digest: str = "") -> str:
    h = hashlib.sha256()
    h.update(nb.read_bytes())
    h.update(json.dumps(params, sort_keys=True).encode())
    h.update(src_digest.encode())
    h.update(read_digest.encode())
    return h.hexdigest()


def shown(p: Path) -> str:
    """A path as the user should read it: relative to the repository when inside it."""
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def execute_one(nb: Path, out_dir: Path, params: dict, src_digest: str, force: bool = False) -> str:
    """Execute one chapter; returns 'cached', 'executed' or raises ChapterFailed."""
    import jupytext
    import nbformat

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{nb.stem}.ipynb"
    stamp = out_dir / f"{nb.stem}.hash"
    profile = params.get("profile", "cpu")
    train_before(nb, params)
    digest = chapter_hash(nb, params, src_digest, records_read(nb, profile))
    if not force and target.exists() and stamp.exists() and stamp.read_text() == digest:
        return "cached"
    notebook = jupytext.read(nb)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if not any("parameters" in c.metadata.get("tags", []) for c in notebook.cells):
        raise ChapterFailed(nb, None, "no cell tagged 'parameters'")
    source_nb = out_dir / f".{nb.stem}.source.ipynb"
    jupytext.write(notebook, source_nb)
    stamp.unlink(missing_ok=True)
    try:
        for _ in range(2):  # once more if the records changed while it ran (it trained them, or another process)
            before = records_read(nb, profile)
            wall = _papermill(nb, source_nb, target, params)
            after = records_read(nb, profile)
            if after == before:
                break
            print(f"    (the records {shown(nb)} reads changed while it ran: executing it again)", flush=True)
    finally:
        source_nb.unlink(missing_ok=True)
    import torch

    executed = nbformat.read(target, as_version=4)
    for cell in executed.cells:  # hide the parameters and the injected parameters
        tags = cell.metadata.get("tags", [])
        if HIDDEN_TAGS & set(tags) and "remove-cell" not in tags:
            cell.metadata["tags"] = [*tags, "remove-cell"]
    executed.metadata["attnid"] = {
        "source": shown(nb),
        "parameters": params,
        "device": resolve_device(params.get("device", "auto")),
        "wall_seconds": round(wall, 1),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
    }
    nbformat.write(executed, target)
    if after == before:  # the records it read are the ones there now
        stamp.write_text(chapter_hash(nb, params, src_digest, after))
    return "executed"


KERNEL_START_TRIES = 3  # starts of a kernel that dies before it runs anything, per chapter


def _papermill(nb: Path, source_nb: Path, target: Path, params: dict) -> float:
    """Execute ``source_nb`` into ``target``; returns the seconds. A failing cell or a dead kernel raises
    :class:`ChapterFailed` naming the chapter; an interrupt propagates (papermill shuts its kernel down). The
    kernel process's own log (its stderr, not the chapter's output) goes to ``<target>.kernel.log``, every
    start's one after the other. A kernel that dies at start is started again (module docstring)."""
    import papermill as pm

    t0 = time.perf_counter()
    log = target.with_suffix(".kernel.log")
    log.write_text("")
    for start in range(1, KERNEL_START_TRIES + 1):
        try:
            _with_stderr_to(log, lambda: _run_papermill(pm, nb, source_nb, target, params, log))
            break
        except KernelDiedAtStart as e:
            if start == KERNEL_START_TRIES:
                raise ChapterFailed(nb, None, f"{e.message}, at each of {start} starts{_last_line(log)}") from None
            print(f"  (its kernel died at start{_last_line(log)}; starting it again)  {shown(nb)}", flush=True)
    return time.perf_counter() - t0


def _with_stderr_to(log: Path, run) -> None:
    """Call ``run()`` with file descriptor 2 appended to ``log`` (the kernel inherits this process's stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(log, "a") as f:
            os.dup2(f.fileno(), 2)
            try:
                run()
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _last_line(log: Path) -> str:
    """``": <the kernel's last words in its log>"`` (what it printed as it died), or ``""`` when it printed
    nothing; the kernel app's warnings and nbclient's own line about the death are not the kernel's words."""
    noise = ("[IPKernelApp]", "Error occurred while starting new kernel client")
    text = log.read_text(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(noise)]
    return f": {lines[-1][:200]}" if lines else ""


def _run_papermill(pm, nb: Path, source_nb: Path, target: Path, params: dict, log: Path) -> None:
    try:
        pm.execute_notebook(
            str(source_nb),
            str(target),
            parameters=params,
            kernel_name="python3",
            cwd=str(ROOT),
            progress_bar=False,
            log_output=False,
        )
    except pm.PapermillExecutionError as e:
        raise ChapterFailed(nb, e.exec_count, f"{e.ename}: {e.evalue}", cell_index=e.cell_index) from None
    except Exception as e:
        lines = [line for line in str(e).strip().splitlines() if line.strip()]
        why = f"{type(e).__name__}: {lines[0] if lines else 'no message'} (kernel log: {shown(log)})"
        if "before replying to kernel_info" in str(e):  # nbclient: the kernel died before it ran anything
            raise KernelDiedAtStart(nb, None, why) from None
        raise ChapterFailed(nb, None, why) from None


class ChapterFailed(Exception):
    def __init__(self, nb: Path, exec_count, message: str, cell_index: int | None = None):
        self.nb, self.exec_count, self.message, self.cell_index = nb, exec_count, message, cell_index
        where = f"cell {cell_index} (execution count {exec_count})" if cell_index is not None else "its kernel"
        super().__init__(f"chapter {shown(nb)} failed in {where}: {message}")


class KernelDiedAtStart(ChapterFailed):
    """The chapter's kernel died before it answered its first request: it ran none of the chapter."""


def reproducibility_page(out: Path, order: list[Path]) -> None:
    import nbformat

    rows = []
    for nb in order:
        path = out / "_generated" / f"{nb.stem}.ipynb"
        if not path.exists():
            continue
        meta = nbformat.read(path, as_version=4).metadata.get("attnid", {})
        p = meta.get("parameters", {})
        extra = ", ".join(f"{k}={v}" for k, v in p.items() if k not in ("profile", "seed", "device"))
        rows.append(
            f"| {{doc}}`{nb.stem} <{nb.stem}>` | `{p.get('profile', '?')}` | {p.get('seed', '?')} "
            f"| {meta.get('device', '?')} | {meta.get('wall_seconds', '?')} | {meta.get('torch', '?')} "
            f"| `{meta.get('git_commit', '?')}` | {meta.get('date', '?')} | {extra or '—'} |"
        )
    text = [
        "# Reproducibility",
        "",
        "Every chapter of this book is a notebook executed by papermill. This page is generated at build",
        "time from the metadata of the executed notebooks: which profile and parameters each chapter ran",
        "with, on which device, how long it took, and from which commit.",
        "",
        "| chapter | profile | seed | device | wall time (s) | torch | commit | executed | other parameters |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "To rerun one chapter yourself, see {doc}`00_introduction`.",
        "",
    ]
    (out / "_generated" / "reproducibility.md").write_text("\n".join(text))


def stage_sources(out: Path) -> None:
    """Copy the book's static sources (config, toc, pages, bibliography) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for p in BOOK_SRC.iterdir():
        if p.name.startswith("_build") or p.name == "_generated":
            continue
        dest = out / p.name
        if p.is_dir():
            shutil.copytree(p, dest, dirs_exist_ok=True)
        elif not dest.exists() or dest.read_bytes() != p.read_bytes():
            shutil.copy2(p, dest)


def plan(action: str, only: list[Path] | None, force: bool) -> tuple[list[Path], set[Path]]:
    """What to execute: ``execute [NB...]`` runs the named chapters (default all, cached unless changed);
    ``build`` brings every chapter up to date; ``build NB...`` (``make chapter NB=...``) re-executes the named
    ones alone, a fork under any name included, and leaves the others as they are; ``force`` re-executes
    everything run."""
    if only:
        return list(only), set(only) if (force or action == "build") else set()
    todo = chapters()
    return todo, set(todo) if force else set()


def placeholders(out: Path, order: list[Path]) -> list[Path]:
    """A page for every chapter of the book that this build has not executed yet (``make chapter`` on a fresh
    checkout), so that the HTML builds with the chapters that were; a chapter executed since loses its
    placeholder. Returns the chapters given one."""
    missing = []
    for nb in order:
        page, executed = out / "_generated" / f"{nb.stem}.md", out / "_generated" / f"{nb.stem}.ipynb"
        if executed.exists():
            page.unlink(missing_ok=True)
            continue
        title = next((line[4:].strip() for line in nb.read_text().splitlines() if line.startswith("# # ")), nb.stem)
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(
            f"# {title}\n\nThis chapter has not been executed in this build. `make book` executes every chapter; "
            f"`make chapter NB={shown(nb)}` executes this one.\n"
        )
        missing.append(nb)
    return missing


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
USER_THREADS = any(v in os.environ for v in THREAD_VARS)  # a count the user set is theirs, and kept


def busy_cores(window_s: float = 0.3) -> float | None:
    """How many cores other work keeps busy now: the machine's CPU time outside idle over ``window_s`` (from
    ``/proc/stat``, while this process sleeps and no chapter of ours runs), in cores; None where there is no
    ``/proc/stat``. Unlike the load average it does not remember the chapter that just finished."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)  # total, idle + iowait

    try:
        t0, i0 = sample()
        time.sleep(window_s)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (os.cpu_count() or 1) * (1 - (i1 - i0) / max(1, t1 - t0))


def share_the_cores() -> int:
    """The torch/BLAS threads of the next chapter (its kernel, and the runs trained for it here): the cores not
    busy with other work at its start (:func:`busy_cores`; the load average where it cannot be read,
    :func:`attnid.lm.profiles.default_threads`), unless the user set a count.
    With more threads than free cores, OpenMP's threads spin waiting for one another: beside two CPU-bound
    processes on 2 cores a loop of small products took 12 s with two threads and 1.1 s with one (0.2 s either
    way on the quiet machine; BENCHMARKS.md). Returns the count."""
    import torch

    from attnid.lm.profiles import default_threads

    n = int(os.environ["OMP_NUM_THREADS"]) if USER_THREADS and os.environ.get("OMP_NUM_THREADS", "").isdigit() else 0
    if not USER_THREADS:
        n = default_threads(busy_cores())  # the load average where /proc/stat cannot be read
        for var in THREAD_VARS:
            os.environ[var] = str(n)
    if n:
        torch.set_num_threads(n)
    return n


def _execute_job(
    nb: Path, out_dir: Path, params: dict, src_digest: str, force: bool, threads: int | None = None
) -> tuple[str, str, float]:
    """:func:`execute_one` (in a worker process when ``threads`` is set: the kernel's torch/BLAS threads,
    so that chapters run side by side do not oversubscribe the cores): ``(status, failure message, seconds)``."""
    if threads is not None:
        for var in THREAD_VARS:
            os.environ[var] = str(threads)
        import torch  # already imported with this module: its threads for the runs trained here (train_before)

        torch.set_num_threads(threads)
        signal.signal(signal.SIGTERM, _interrupt)  # a worker: the book tool forwards SIGTERM to it
    from attnid.lm.lifecycle import Interrupted as TrainingInterrupted

    t = time.perf_counter()
    try:
        try:
            return execute_one(nb, out_dir, params, src_digest, force=force), "", time.perf_counter() - t
        finally:
            if threads is not None:  # an idle worker ends quietly on SIGTERM
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ChapterFailed as e:
        return "failed", str(e), time.perf_counter() - t
    except (KeyboardInterrupt, TrainingInterrupted) as e:
        if isinstance(e, TrainingInterrupted):  # stopped while it trained a chapter's runs (train_before):
            raise KeyboardInterrupt(str(e.__context__ or "")) from None  # the signal's own interrupt
        # the interrupted cell's asyncio task ends with its kernel ("Kernel died"); asyncio would print that
        # task's traceback when it is collected, after the tool's one-line message
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        raise


def _interrupt(signum, frame):
    """The first SIGTERM or SIGINT stops the build; any that follow while it stops are ignored (the stop is bounded:
    workers get a grace period, then are killed), so that a second signal cannot break the stop in half."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt(signal.Signals(signum).name)


class Interrupted(Exception):
    """The build was stopped (SIGTERM, Ctrl-C); ``unfinished`` chapters were not stamped."""

    def __init__(self, unfinished: list[Path], signame: str):
        self.unfinished, self.signame = unfinished, signame
        super().__init__(
            f"interrupted ({signame}): {len(unfinished)} chapter(s) not finished "
            f"({', '.join(shown(p) for p in unfinished) or 'none'}); nothing of theirs was stamped, and the "
            "same command resumes (finished chapters and run records are reused)"
        )


def execute_all(out: Path, params: dict, todo: list[Path], src_dir: Path, forced: set[Path], jobs: int = 1) -> dict:
    """Execute ``todo`` (cached unless changed), ``jobs`` chapters at a time; chapters in ``forced`` always
    re-execute. Chapters that train share their run records safely (each run is locked while it trains)."""
    src_digest = tree_hash(src_dir)
    status, failures = {}, {}
    args = [(nb, out / "_generated", params, src_digest, nb in forced) for nb in todo]

    def report(nb: Path, result: tuple[str, str, float]) -> None:
        status[nb.stem], message, seconds = result
        if message:
            failures[nb] = message
        print(f"  {status[nb.stem]:>8}  {shown(nb)}  ({seconds:.1f} s)", flush=True)

    if jobs <= 1 or len(todo) <= 1:
        suites, todo = plan_ahead(todo, params)
        args = [(nb, out / "_generated", params, src_digest, nb in forced) for nb in todo]
        ahead = TrainingAhead(params.get("profile", "cpu"), suites, params.get("device", "auto")) if suites else None
        try:
            for i, a in enumerate(args):
                try:
                    needed = [name for name in suites if name in suites_read(a[0].read_text())]
                    if ahead is not None and needed:
                        ahead.wait_for(needed)
                    share_the_cores()
                    report(a[0], _execute_job(*a))
                except KeyboardInterrupt as e:
                    raise Interrupted([x[0] for x in args[i:]], str(e) or "SIGINT") from None
        finally:
            if ahead is not None:
                ahead.stop()
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        ctx = multiprocessing.get_context("spawn")
        workers = min(jobs, len(todo))
        threads = max(1, (os.cpu_count() or 1) // workers)
        pool = ProcessPoolExecutor(workers, mp_context=ctx)
        futures = {pool.submit(_execute_job, *a, threads): a[0] for a in args}
        try:
            for f in as_completed(futures):
                try:
                    result = f.result()
                except BrokenProcessPool:  # the worker itself died (killed, out of memory)
                    result = ("failed", f"chapter {shown(futures[f])} failed: its worker process died", 0.0)
                report(futures[f], result)
        except KeyboardInterrupt as e:
            _stop_workers(pool, futures)
            unfinished = [futures[f] for f in futures if not f.done() or f.cancelled() or f.exception()]
            raise Interrupted([nb for nb in todo if nb in unfinished], str(e) or "SIGINT") from None
        pool.shutdown(wait=True)
    if failures:
        print("\n".join(["", "BUILD FAILED:"] + [failures[nb] for nb in todo if nb in failures]), file=sys.stderr)
        raise SystemExit(1)
    return status


def _stop_workers(pool, futures: dict, grace_s: float = 60.0) -> None:
    """Forward an interrupt to the pool's workers (each stops its kernel and returns the interrupt as its
    chapter's result), wait up to ``grace_s`` for them, kill any worker still busy, and let the pool go
    without waiting on it (a worker stopped mid-message could leave the pool's queues blocked)."""
    from concurrent.futures import wait

    procs = [p for p in getattr(pool, "_processes", {}).values() if p.is_alive()]
    for proc in procs:
        proc.terminate()
    wait(futures, timeout=grace_s)
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()


def build_html(out: Path) -> None:
    jb = shutil.which("jupyter-book", path=str(Path(sys.executable).parent)) or "jupyter-book"
    cmd = [jb, "build", str(out), "--warningiserror", "--nitpick", "--keep-going", "--quiet"]
    r = subprocess.run(cmd, cwd=ROOT)
    if r.returncode:
        print(f"BUILD FAILED: jupyter-book reported warnings or errors (see above) for {out}", file=sys.stderr)
        raise SystemExit(r.returncode)
    print(f"book: {out / '_build' / 'html' / 'index.html'}")


def main(argv: list[str] | None = None) -> None:  # noqa: C901, PLR0915 (reason in the docstring)
    """The command line: parse, check the folders, then build, execute or serve.

    Long because each flag's check sits beside its flag, so that an error names it before any work starts.
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["build", "execute", "serve"])
    ap.add_argument("notebooks", nargs="*", type=Path, help="chapters to execute (default: all)")
    ap.add_argument("--profile", default=os.environ.get("PROFILE", "cpu"))
    ap.add_argument("--device", default=os.environ.get("DEVICE", "auto"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="staging folder (default build/<profile>)")
    ap.add_argument("--src-dir", type=Path, default=ROOT / "src", help="code whose changes invalidate the cache")
    ap.add_argument("--force", action="store_true", help="re-execute even if cached")
    ap.add_argument("--jobs", type=int, default=1, help="chapters executed at once (2 suits two idle cores)")
    ap.add_argument("--port", type=int, default=8000)
    a = ap.parse_intermixed_args(argv)
    if a.profile not in PROFILES:
        ap.error(f"profile must be one of {', '.join(PROFILES)}, got {a.profile!r}")
    if a.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {a.jobs}")
    out = (a.out or ROOT / "build" / a.profile).resolve()
    if out.exists() and not out.is_dir():
        ap.error(f"--out {out}: exists and is not a folder")
    if a.action == "serve":
        html = out / "_build" / "html"
        if not html.exists():
            ap.error(f"{html} does not exist: run `make book` first")
        print(f"serving {html} on http://127.0.0.1:{a.port}/")
        subprocess.run(
            [sys.executable, "-m", "http.server", str(a.port), "--bind", "127.0.0.1", "--directory", str(html)]
        )
        return
    only = [p.resolve() for p in a.notebooks] or None
    for p in only or []:
        if not p.exists():
            ap.error(f"no such chapter: {p}")
        if not p.is_file() or p.suffix != ".py":
            ap.error(f"{p}: not a chapter source (a jupytext .py file in notebooks/)")
    from attnid.audit import check_seed

    try:
        check_seed(a.seed)  # before any chapter starts, with the library's bound and words
    except ValueError as e:
        ap.error(str(e))
    params = {"profile": a.profile, "seed": a.seed, "device": a.device}
    signal.signal(signal.SIGTERM, _interrupt)  # what timeout, a CI cancel and systemd send
    signal.signal(signal.SIGINT, _interrupt)  # Ctrl-C, even where a shell started us with SIGINT ignored
    t0 = time.perf_counter()
    stage_sources(out)
    print(f"executing chapters (profile={a.profile}, device={a.device}) into {out / '_generated'}")
    todo, forced = plan(a.action, only, a.force)
    try:
        execute_all(out, params, todo, a.src_dir.resolve(), forced, jobs=a.jobs)
    except Interrupted as e:
        print(str(e), file=sys.stderr)
        raise SystemExit(143 if e.signame == "SIGTERM" else 130) from None
    toc = (BOOK_SRC / "_toc.yml").read_text()
    for p in only or []:
        target = out / "_generated" / f"{p.stem}.ipynb"
        print(f"{shown(p)} -> {shown(target)}")
        if f"_generated/{p.stem}" not in toc:
            print(f"  not in the book yet: add `- file: _generated/{p.stem}` to book/_toc.yml to publish it")
    reproducibility_page(out, chapters())
    if a.action == "build":
        missing = placeholders(out, chapters())
        if missing:
            print(f"  not executed in this build (a page says so): {', '.join(shown(p) for p in missing)}")
        build_html(out)
    print(f"done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
