"""The ``attnid`` command: ``count``, ``audit``, ``presets``, ``train``, ``data``, ``experiments``, ``claims``
(``--json`` for machine output). One module per subcommand holds its parser beside its work (:mod:`.count`,
:mod:`.audit`, :mod:`.presets`, :mod:`.runs` for ``train``, ``data`` and ``experiments``, :mod:`.claims`), on the
helpers they share (:mod:`.common`); this module builds the parser and turns expected failures into exit codes."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap
from typing import Any

from .. import __version__
from ..extras import MissingExtra, require
from ..interrupts import sigterm_as_interrupt
from .commands import COMMANDS, EXIT_CODES

CORE_OF_EXTRAS = ("torch", "numpy", "scipy")  # what every command of an extra imports (the rest where it is used)

# the exceptions a command's failure may raise, by exit code, as "module:Class" of attnid: a module that was never
# imported raised none of its own, so only the loaded ones are looked up (and `count` loads no torch to catch them)
BAD_INPUT = ("lm.data:DataError", "lm.records:Refused")
FAILED_CHECK = (
    "lm.records:RecordError",
    "certify.linalg:CertificateError",
    "lm.launch:LaunchError",
    "hf.build:HFAuditError",
)


def _loaded(names: tuple[str, ...], *also: type[Exception]) -> tuple[type[Exception], ...]:
    """The exception classes ``names`` of the attnid modules imported so far, after ``also``."""
    out = list(also)
    for name in names:
        module, cls = name.split(":")
        m = sys.modules.get(f"attnid.{module}")
        if m is not None:
            out.append(getattr(m, cls))
    return tuple(out)


__all__ = ["build_parser", "main", "strict_json"]


def __getattr__(name: str) -> Any:  # strict_json, loaded with its module (and torch) when asked for
    if name == "strict_json":
        from .common import strict_json

        return strict_json
    raise AttributeError(f"module 'attnid.cli' has no attribute {name!r}")


def build_parser(full: bool = True, only: str | None = None) -> argparse.ArgumentParser:
    """The ``attnid`` argument parser: every subcommand with its flags (each built by its module), or with ``only``
    that one (the others by name and help); ``full=False``: every subcommand by name and help only, without importing
    any (what ``attnid --help`` needs)."""
    ap = argparse.ArgumentParser(
        prog="attnid",
        description=textwrap.fill(
            "Parameter identification in attention layers: which weights of an attention layer (or a whole model) "
            "have no effect on its output, counted in closed form and checked numerically; and the training "
            "experiments of the paper's §5. Each command's --help gives its flags and examples.",
            100,
        ),
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--version", action="version", version=f"attnid {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, c in COMMANDS.items():
        if full and only in (None, name):
            if c.extra:  # before its module's import, which needs the extra
                require(c.extra, f"attnid {name}", CORE_OF_EXTRAS)
            getattr(importlib.import_module(c.module, __name__), f"{name}_parser")(sub)
        else:
            sub.add_parser(name, help=c.help, add_help=False)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Expected failures print one line ``attnid: error: ...`` with the exit codes of
    :data:`attnid.cli.commands.EXIT_CODES`; anything else is a bug and keeps its traceback. Only the subcommand
    named is imported (``--help`` and ``--version`` import no torch)."""
    args = sys.argv[1:] if argv is None else argv
    named = args[0] if args and args[0] in COMMANDS else None
    try:
        ap = build_parser(full=named is not None, only=named)
    except MissingExtra as e:  # the subcommand's extra is not installed
        print(f"attnid: error: {e}", file=sys.stderr)
        return 2
    a, unknown = ap.parse_known_args(args)
    if unknown:  # said by the subcommand's parser, with its usage (the top-level one would print its own)
        sub = next(x for x in ap._actions if isinstance(x, argparse._SubParsersAction))
        sub.choices[a.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        with sigterm_as_interrupt():  # SIGTERM stops a command as Ctrl-C does, with its one line
            return a.func(a)
    except _loaded(BAD_INPUT, ValueError, MissingExtra) as e:
        print(f"attnid: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # an allocation the machine refused (the guards estimate; they can be overridden)
        print(f"attnid: error: {str(e) or 'out of memory'}", file=sys.stderr)  # its text is often empty
        return 1
    except _loaded(("lm.launch:Stopped",)) as e:  # a local suite stopped, its jobs with it
        print(f"attnid: {e}", file=sys.stderr)
        return 143 if getattr(e, "signame", "") == "SIGTERM" else 130
    except _loaded(FAILED_CHECK) as e:
        print(f"attnid: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of stdout went away (`| head`): what it read is what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # the machine said no: a read-only folder, a full disk, a missing program
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"attnid: error: {e.strerror or e}{where}; a run that stopped resumes when rerun", file=sys.stderr)
        return 1
    except _loaded(("lm.lifecycle:Interrupted",)) as e:
        print(f"attnid: {e}", file=sys.stderr)
        return 143 if getattr(e, "signame", "") == "SIGTERM" else 130
    except KeyboardInterrupt as e:  # outside a training loop (a loop reports its step itself)
        signame = getattr(e, "signame", "SIGINT")
        print(
            f"attnid: interrupted ({signame}, attnid {a.command}); finished runs and records are kept and reused: "
            "run the same command again",
            file=sys.stderr,
        )
        return 143 if signame == "SIGTERM" else 130


if __name__ == "__main__":
    sys.exit(main())
