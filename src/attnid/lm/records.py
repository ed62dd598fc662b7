"""Run records of chapters 6 and 7: the one module that names, writes, reads and checks them.

A run lives in ``<runs>/<profile>/<case>`` (seed 0) or ``<runs>/<profile>/<case>-s<seed>``::

    config.json       the run's configuration (written once the run's checks have passed)
    metrics.jsonl.gz  one JSON row per recorded step, numbers rounded to float32 precision
    heads.json        end-of-run head analysis: importance, pruning curve, effective ranks
    summary.json      written last; marks a finished run, lists every file with size and sha256, and is
                      sealed: ``seal`` is the sha256 of the rest of it (:func:`seal_of`)
    checkpoint.pt     resume point of an unfinished run (removed when the run finishes)
    model.pt          trained weights, only when asked for (never needed by the book)

A finished run is reused only when its summary is sealed and unchanged, names the profile, case and seed
of its config, every file it lists is present and unchanged, and its rows reach ``max_iters``. Anything
else fails with a :class:`RecordError` that names the file and says ``--force``. ``<runs>`` is
``$ATTNID_RUNS``, else ``data/runs`` under the project root (:func:`project_root`: ``$ATTNID_HOME``, else the
source checkout when the command runs inside it, else the user data folder).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..inputs import printable
from .places import (  # noqa: F401 (re-exported: where records live, in its own module)
    checkout,
    code_commit,
    project_root,
    run_dir,
    run_name,
    runs_root,
    user_data_dir,
)

# 1: metrics.jsonl with 17-digit floats, no file list (commit 360a5c8 and before); 2: no seal on summary.json;
# 3: summary.json sealed (a record of format 2 that verifies is sealed by `python tools/import_records.py --seal DIR`)
FORMAT = 3
ROWS_FILE = "metrics.jsonl.gz"
# the largest files a record may hold, checked before a file is read (a paper-scale record's rows are ~2 MB, a
# smoke or cpu model.pt with its snapshots under 50 MB): a file, or a rows file once decompressed, above its bound
# is refused instead of filling the memory
MAX_JSON_BYTES = 64 * 2**20
MAX_ROWS_BYTES = 256 * 2**20  # metrics.jsonl(.gz), decompressed
MAX_TENSOR_BYTES = 2**31 - 1  # model.pt, checkpoint.pt: under 2 GiB (a file of exactly 2 GiB is refused too)
LEGACY_ROWS_FILE = "metrics.jsonl"


class RecordError(RuntimeError):
    """A run record is damaged or does not match; the message names the file and the fix."""


class Refused(RecordError):
    """A file attnid will not read: it would run code when parsed, or it differs from the seal of the record it
    sits in (the command exits 2, as for any bad input)."""


class MissingValues(RecordError):
    """A record's rows lack (hold null for) a value the metrics schema says they hold."""


# ------------------------------------------------------------------------------ writing
def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a uniquely named temporary file in the same folder."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make records private
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def round_floats(obj, digits: int = 7):
    """Floats rounded to ``digits`` significant digits (float32 precision); nan/inf become ``None``."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}") if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: round_floats(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [round_floats(v, digits) for v in obj]
    return obj


def encode_rows(rows: list[dict]) -> bytes:
    text = "".join(json.dumps(round_floats(r), separators=(",", ":")) + "\n" for r in rows)
    return gzip.compress(text.encode(), compresslevel=9, mtime=0)


def write_json(path: Path, obj) -> None:
    atomic_write(path, (json.dumps(obj, indent=2) + "\n").encode())


def write_rows(d: Path, rows: list[dict]) -> None:
    atomic_write(d / ROWS_FILE, encode_rows(rows))


OWNED_FILES = (
    "config.json",
    ROWS_FILE,
    LEGACY_ROWS_FILE,
    "heads.json",
    "summary.json",
    "checkpoint.pt",
    "model.pt",
    "points.json",
)


def replace_record(new: Path, d: Path) -> None:
    """Move the finished record in folder ``new`` into ``d`` (``--force``): the files a record owns are
    removed from ``d`` first, anything else there (a user's notes) stays; ``summary.json`` moves last, so
    ``d`` is a finished record again only once every file is in place. ``d`` may be a symlink to a folder."""
    target = d.resolve()
    target.mkdir(parents=True, exist_ok=True)
    (target / "summary.json").unlink(missing_ok=True)  # first: a half-replaced folder is never "finished"
    for name in OWNED_FILES:
        (target / name).unlink(missing_ok=True)
    names = sorted((p.name for p in new.iterdir()), key=lambda n: n == "summary.json")
    for name in names:
        os.replace(new / name, target / name)
    new.rmdir()


def file_entry(path: Path) -> dict:
    """``{"bytes", "sha256"}`` of ``path``, hashed in blocks (never held whole)."""
    _regular(path)
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(2**20):
            h.update(block)
            n += len(block)
    return {"bytes": n, "sha256": h.hexdigest()}


def bound_of(name: str) -> int:
    """The largest size a record's file ``name`` may have (:data:`MAX_JSON_BYTES`, ...)."""
    return MAX_TENSOR_BYTES if name.endswith(".pt") else MAX_ROWS_BYTES if "jsonl" in name else MAX_JSON_BYTES


def check_size(path: Path, limit: int) -> None:
    """Refuse ``path`` when it is larger than ``limit`` bytes, before it is read."""
    size = path.stat().st_size
    if size > limit:
        raise Refused(f"{path}: refused: {size:,} bytes, more than the {limit:,} a record's {path.name} may hold")


def seal_of(summary: dict) -> str:
    """The seal of a summary: the sha256 of its canonical JSON without the ``seal`` key. A hand edit of any value
    of ``summary.json`` (a rebalance's loss, ``rho_method``, the seed) breaks it."""
    body = {k: v for k, v in summary.items() if k != "seal"}
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def write_summary(d: Path, summary: dict) -> dict:
    """Seal ``summary`` (format :data:`FORMAT`) and write it as ``d/summary.json``; returns what was written."""
    summary = {**summary, "format": FORMAT}
    summary["seal"] = seal_of(summary)
    write_json(d / "summary.json", summary)
    return summary


def finish(d: Path, rows: list[dict], summary: dict, heads: dict | None = None) -> dict:
    """Write the rows, the head analysis and, last, the sealed summary (with its file list) of a run."""
    write_rows(d, rows)
    names = ["config.json", ROWS_FILE]
    if heads is not None:
        write_json(d / "heads.json", round_floats(heads))
        names.append("heads.json")
    if (d / "model.pt").exists():
        names.append("model.pt")
    summary = write_summary(d, {**summary, "files": {n: file_entry(d / n) for n in names}})
    (d / "checkpoint.pt").unlink(missing_ok=True)
    return summary


# ------------------------------------------------------------------------------ reading
def tensors_problem(got, want: dict[str, tuple]) -> tuple[str, str] | None:
    """What is wrong with ``got`` as tensors of ``want``'s names and shapes, finite floats all: ``("dict", "")``
    (not a dict), ``("fit", name)`` (the first name missing, extra or of another shape) or ``("finite", name)`` (the
    first not a finite float tensor); None when nothing is."""
    import torch

    if not isinstance(got, dict):
        return "dict", ""
    shapes = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else None for k, v in got.items()}
    if shapes != want:
        diff = sorted(set(shapes) ^ set(want), key=str) or sorted(k for k in want if shapes[k] != want[k])
        return "fit", printable(diff[0])
    bad = [k for k, v in got.items() if not v.is_floating_point() or not bool(torch.isfinite(v).all())]
    return ("finite", printable(", ".join(bad[:3]))) if bad else None


def load_tensors(data: bytes, path: Path, map_location: str = "cpu"):
    """``torch.load`` of the bytes of a tensor file attnid wrote (``model.pt``, ``checkpoint.pt``) without running
    code: ``weights_only=True``, with :class:`attnid.lm.metrics.Key` (the rows' keys) the one class allowed. A
    pickle that asks for anything else (``os.system``, a class of its own) is refused, naming ``path``."""
    import io
    import pickle

    import torch

    from .metrics import Key

    try:
        with torch.serialization.safe_globals([Key]):
            return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        said = [line.strip() for line in str(e).splitlines() if "GLOBAL" in line]  # it asks for a function or class
        if not said:
            raise RecordError(f"{path}: damaged (not a tensor file torch can read)") from None
        why = printable(said[0], 200)
        raise Refused(
            f"{path}: refused: not a plain tensor file ({why}); attnid reads tensor files without running code"
        ) from None
    except Exception as e:  # a truncated or foreign file: torch raises RuntimeError, EOFError, ValueError, ...
        raise RecordError(f"{path}: damaged ({type(e).__name__}: {printable(e, 80)})") from None


def sealed_bytes(d: Path, name: str) -> tuple[bytes, str]:
    """The bytes of file ``name`` of the finished record in folder ``d`` and their sha256, read and hashed once and
    checked, before anything parses them, against the size and sha256 that the record's sealed ``summary.json``
    lists for it. Raises
    ``FileNotFoundError`` if the file is absent, :class:`RecordError` naming the file if it is not a regular
    file, the summary is missing or not sealed, the file is not listed, or its bytes differ."""
    d = Path(d)
    f = d / name
    _regular(f)
    if not f.exists():
        raise FileNotFoundError(f"no {name} in {d}")
    if not (d / "summary.json").is_file():
        raise Refused(
            f"{f}: refused: no sealed summary.json beside it (attnid reads {name} only from a finished record)"
        )
    summary = read_json(d / "summary.json")
    if not isinstance(summary, dict) or summary.get("seal") != seal_of(summary):
        raise Refused(f"{f}: refused: its record's summary.json is not sealed or was changed since the run finished")
    files = summary.get("files")
    entry = files.get(name) if isinstance(files, dict) else None
    if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str)):
        raise Refused(f"{f}: refused: not listed in its record's sealed summary.json")
    check_size(f, bound_of(name))
    if f.stat().st_size != entry.get("bytes"):
        raise Refused(
            f"{f}: refused: differs from the size and sha256 that its record's sealed summary.json lists (changed "
            "since the run finished)"
        )
    data = f.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != entry.get("bytes") or digest != entry["sha256"]:
        raise Refused(
            f"{f}: refused: differs from the size and sha256 that its record's sealed summary.json lists (changed "
            "since the run finished)"
        )
    return data, digest


@dataclass
class Record:
    """A finished run: its folder, config and summary dicts, rows and (optional) head analysis."""

    path: Path
    config: dict
    summary: dict
    rows: list[dict]
    heads: dict | None = None

    @property
    def name(self) -> str:
        return f"{self.config.get('profile')}/{self.path.name}"


def _fail(path: Path, what: str) -> RecordError:
    return RecordError(
        f"{path}: {what}; redo the run with `attnid train ... --force` (or `attnid experiments --force`)"
    )


def _regular(path: Path) -> None:
    """Refuse a path that exists but is no regular file (a FIFO would block a read for ever)."""
    if path.exists() and not path.is_file():
        raise _fail(path, "not a regular file")


def read_json(path: Path):
    _regular(path)
    try:
        check_size(path, MAX_JSON_BYTES)
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise _fail(path, "missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(path, f"not valid JSON ({printable(e)})") from None
    except RecursionError:
        raise _fail(path, "nests its JSON too deeply") from None


def read_rows(d: Path, max_rows: int | None = None) -> list[dict]:
    """The rows of ``d``: ``metrics.jsonl.gz``, or a format-1 ``metrics.jsonl``; with ``max_rows``, a file of more
    lines is refused before any is parsed (parsing costs far more than the bytes: 64 MiB of ``{}`` rows, 3 GB)."""
    path = d / ROWS_FILE if (d / ROWS_FILE).exists() or not (d / LEGACY_ROWS_FILE).exists() else d / LEGACY_ROWS_FILE
    _regular(path)
    try:
        check_size(path, MAX_ROWS_BYTES)
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            raw = f.read(MAX_ROWS_BYTES + 1)  # decompression stops at the bound
        if len(raw) > MAX_ROWS_BYTES:
            raise Refused(f"{path}: refused: more than {MAX_ROWS_BYTES:,} bytes of rows once decompressed")
        newlines = raw.count(b"\n")  # counted in the bytes, before any split (64 MiB of "{}" rows: 21 M strings)
        if max_rows is not None and newlines > 2 * max_rows + 1:
            raise Refused(f"{path}: refused: {newlines:,} lines, more than the {max_rows:,} rows its run records")
        lines = [line for line in raw.decode().splitlines() if line.strip()]
        if max_rows is not None and len(lines) > max_rows:
            raise Refused(f"{path}: refused: {len(lines):,} rows, more than the {max_rows:,} rows its run records")
        return [json.loads(line) for line in lines]
    except FileNotFoundError:
        raise _fail(path, "missing") from None
    except RecursionError:
        raise _fail(path, "damaged (a row nests its JSON too deeply to be a row)") from None
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(path, f"damaged ({type(e).__name__}: {e})") from None


def expected_steps(config: dict, metrics: bool = True) -> list[int]:
    """The steps a run records: every evaluation, the first and the last, and with metrics every
    ``metric_interval``-th."""
    n, mi, ei = config["max_iters"], config["metric_interval"], config["eval_interval"]
    return [it + 1 for it in range(n) if (metrics and it % mi == 0) or (it + 1) % ei == 0 or it == 0 or it == n - 1]


def is_finished(d: Path) -> bool:
    return (d / "summary.json").exists()


def _check_summary(d: Path, summary: dict, config: dict, sealed: bool = True) -> dict:
    """The summary's format, seal, identity and file list, validated; returns the file list. ``sealed=False``
    accepts a record of format 2 without a seal (only :func:`seal` does, to seal it)."""
    f = d / "summary.json"
    fmt = summary.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool) or not 1 <= fmt <= FORMAT:
        raise _fail(f, f"unknown record format {fmt!r} (this attnid reads 1 to {FORMAT})")
    files = summary.get("files")
    if fmt < FORMAT and files is None:
        raise RecordError(
            f"{f}: made by an older attnid (record format {fmt}, now {FORMAT}); redo the run with "
            "`attnid train ... --force`"
        )
    if fmt == FORMAT and summary.get("seal") != seal_of(summary):
        raise _fail(f, "changed since the run finished (its seal does not match its contents)")
    if fmt < FORMAT and sealed:
        raise RecordError(
            f"{f}: not sealed (record format {fmt}, now {FORMAT}); `python tools/import_records.py --seal {d}` seals "
            "a record that verifies, or redo the run with `attnid train ... --force`"
        )
    for key in ("profile", "case", "seed"):
        if key in summary and summary[key] != config.get(key):
            raise _fail(f, f"names {key} {summary[key]!r}, its config.json {config.get(key)!r}")
    if not isinstance(files, dict) or not files:
        raise _fail(f, "has no file list (a record's summary lists every file with its size and sha256)")
    for name in ("config.json", ROWS_FILE if fmt >= 2 else LEGACY_ROWS_FILE):
        if name not in files and not (name == ROWS_FILE and LEGACY_ROWS_FILE in files):
            raise _fail(f, f"its file list lacks {name}")
    for name, entry in files.items():
        ok = (
            isinstance(name, str)
            and name in OWNED_FILES
            and isinstance(entry, dict)
            and isinstance(entry.get("bytes"), int)
            and isinstance(entry.get("sha256"), str)
            and len(entry["sha256"]) == 64
        )
        if not ok:
            raise _fail(f, f"file list entry {name!r} is not {{'bytes': int, 'sha256': 64 hex digits}}")
    return files


def _same(a, b) -> bool:
    """Equal to float32 precision (the rows are stored rounded to 7 significant digits)."""
    if a is None or b is None:
        return a is b
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-6)


def _check_listed(p: Path, summary) -> None:
    """Refuse ``p`` when the summary lists it with another size or sha256 (nothing to check when it does not list
    it: :func:`_check_summary` then names what is wrong)."""
    files = summary.get("files") if isinstance(summary, dict) else None
    entry = files.get(p.name) if isinstance(files, dict) else None
    if not isinstance(entry, dict) or not p.is_file():
        return  # a missing entry or file, which the later checks name
    if isinstance(entry.get("bytes"), int) and isinstance(entry.get("sha256"), str):  # else malformed: named later
        _check_file(p, entry)


def _check_file(p: Path, entry: dict) -> None:
    """Refuse ``p`` when it is not the file its entry lists: past its bound, or of another size or sha256."""
    check_size(p, bound_of(p.name))
    if p.stat().st_size != entry["bytes"] or file_entry(p)["sha256"] != entry["sha256"]:
        raise _fail(p, "changed since the run finished (size or sha256 differs from summary.json)")


def _check_files(d: Path, files: dict, checked: tuple[str, ...] = ()) -> None:
    """Every listed file present and unchanged (``checked``: those :func:`_check_listed` hashed already), and no
    unlisted file beside them that would be read."""
    for name, entry in files.items():
        if not (d / name).exists():
            raise _fail(d / name, "missing (listed in summary.json)")
        if name not in checked:
            _check_file(d / name, entry)
    for name in ("heads.json", ROWS_FILE, LEGACY_ROWS_FILE):  # read if present: so each must be sealed
        if (d / name).exists() and name not in files:
            raise Refused(f"{d / name}: refused: not listed in its record's sealed summary.json")


def _row_bound(config: dict, summary: dict) -> int | None:
    """How many rows the run records (``None`` where its config cannot say: :func:`_check_rows` then names why)."""
    try:
        return len(expected_steps(config, summary.get("metrics", True)))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _loss(v) -> bool:
    """A loss as a row holds it: absent (None) or a finite number >= 0 (a cross-entropy)."""
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0)


def _check_rows(d: Path, summary: dict, config: dict, rows: list) -> None:
    """Every row a dict with the schema's steps; the numbers the summary repeats equal the rows'."""
    f = d / (ROWS_FILE if (d / ROWS_FILE).exists() else LEGACY_ROWS_FILE)
    if not rows:
        raise _fail(f, "holds no rows")
    if not all(isinstance(r, dict) and isinstance(r.get("step"), int) for r in rows):
        raise _fail(f, "holds rows that are not {'step': int, ...} objects")
    n = config.get("max_iters")
    if not isinstance(n, int) or rows[-1]["step"] != n:
        raise _fail(f, f"ends at step {rows[-1]['step']}, not max_iters={n}")
    steps, expected = [r["step"] for r in rows], expected_steps(config, summary.get("metrics", True))
    if steps != expected:
        raise _fail(f, f"holds {len(steps)} rows, expected {len(expected)}")
    bad = next((r["step"] for r in rows if not (_loss(r.get("val_loss")) and _loss(r.get("train_loss")))), None)
    if bad is not None:
        raise _fail(f, f"holds a loss at step {bad} that is not a finite number >= 0")
    vals = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    repeated = {
        "steps": (summary.get("steps"), n),
        "final_val_loss": (summary.get("final_val_loss"), vals[-1] if vals else None),
        "best_val_loss": (summary.get("best_val_loss"), min(vals) if vals else None),
        "final_train_loss": (summary.get("final_train_loss"), rows[-1].get("train_loss")),
    }
    for key, (said, rows_say) in repeated.items():
        if key in summary and not _same(said, rows_say):
            raise _fail(d / "summary.json", f"says {key} = {said!r}, its rows say {rows_say!r}")


def check_place(d: Path, config: dict) -> None:
    """Refuse a record whose folder is not where its ``config.json`` puts it (``<profile>/<case>[-s<seed>]``):
    the record, not the folder name, says what a run is, so a copy under another name or profile is refused.
    A forced run's temporary folder (``.<name>.force-*``) is exempt."""
    if d.name.startswith("."):
        return
    try:
        want = (str(config["profile"]), run_name(str(config["case"]), int(config["seed"])))
    except (KeyError, TypeError, ValueError):
        raise _fail(d / "config.json", "names no profile, case and seed") from None
    if (d.parent.name, d.name) != want:
        raise _fail(
            d / "config.json",
            f"is the record of {want[0]}/{want[1]} (profile {config['profile']}, case {config['case']}, seed "
            f"{config['seed']}) but sits in {d.parent.name}/{d.name}: a record is read only from its own folder",
        )


def load(d: Path, *, verify: bool = True, sealed: bool = True) -> Record:
    """Read and check a finished run in ``d``; raise :class:`RecordError` naming what is wrong.

    Checked: the folder is the one its config names (:func:`check_place`), the summary's format is one this
    code reads, its file list is complete and well formed,
    every listed file is present with its size and sha256, the rows are the expected steps up to
    ``max_iters``, and the numbers the summary repeats (steps, final and best losses) equal the rows'."""
    d = Path(d)
    if not (d / "summary.json").exists():
        raise RecordError(f"{d}: no finished run (summary.json missing); run it with `attnid train` first")
    summary = read_json(d / "summary.json")
    if verify:  # the config is parsed only once it is the file the summary lists (parsing is what costs)
        _check_listed(d / "config.json", summary)
    config = read_json(d / "config.json")
    if not isinstance(summary, dict):
        raise _fail(d / "summary.json", "not a run summary (a JSON object)")
    if not isinstance(config, dict):
        raise _fail(d / "config.json", "not a run config (a JSON object)")
    if verify:
        check_place(d, config)
        _check_files(d, _check_summary(d, summary, config, sealed), checked=("config.json",))
    rows = read_rows(d, _row_bound(config, summary) if verify else None)
    if verify:
        _check_rows(d, summary, config, rows)
    heads = read_json(d / "heads.json") if (d / "heads.json").exists() else None
    if heads is not None and not isinstance(heads, dict):
        raise _fail(d / "heads.json", "not a head analysis (a JSON object)")
    return Record(d, config, summary, rows, heads)


def load_run(profile: str, case: str, seed: int = 0, base: Path | None = None) -> Record:
    """The finished record of ``profile/case`` (seed); :class:`RecordError` if absent or damaged."""
    d = run_dir(profile, case, seed, base)
    if not is_finished(d):
        raise RecordError(
            f"no finished run in {d}; make it with `attnid train --profile {profile} --case {case}"
            + (f" --seed {seed}" if seed else "")
            + "`"
        )
    return load(d)


def committed_root() -> Path:
    """The records that ship with the project (``data/runs`` of the checkout, wherever the command runs), e.g. the
    paper-scale runs; ``$ATTNID_HOME`` stands for the checkout where it is set."""
    root = checkout()
    if os.environ.get("ATTNID_HOME") or root is None:
        return project_root() / "data" / "runs"
    return root / "data" / "runs"


COMMITTED_PROFILES = ("paper", "mid")  # the profiles whose records ship with the project (data/runs/<profile>)


def record_roots(profile: str, base: Path | None = None, committed: bool = True) -> list[Path]:
    """Where the records of ``profile`` are read: ``base`` (default :func:`runs_root`), then, for a profile whose
    records ship with the project (:data:`COMMITTED_PROFILES`) and ``committed``, the committed records. A
    checkout's own reruns of another profile (``data/runs/cpu`` left by a ``make book``) are not read from a runs
    folder elsewhere."""
    first = Path(runs_root() if base is None else base)
    both = committed and profile in COMMITTED_PROFILES
    return list(dict.fromkeys([first, committed_root()] if both else [first]))


def find_runs(
    profile: str, cases: list[str], seed: int = 0, base: Path | None = None, committed: bool = True
) -> dict[str, Record]:
    """The finished records among ``cases``, from :func:`record_roots` (``base``, then, with ``committed``, the
    committed records of a committed profile); missing runs are left out, damaged ones raise :class:`RecordError`."""
    found = {}
    for case in cases:
        for root in record_roots(profile, base, committed):
            d = run_dir(profile, case, seed, root)
            if is_finished(d):
                found[case] = load(d)
                break
    return found


def seal(d: Path) -> dict:
    """Seal the record in ``d`` (format 2, made before summaries were sealed) once it verifies whole: its files
    against the list, its rows against the config; returns the sealed summary. A sealed record is left as it is."""
    rec = load(Path(d), sealed=False)
    if rec.summary.get("format") == FORMAT:
        return rec.summary
    return write_summary(Path(d), rec.summary)
