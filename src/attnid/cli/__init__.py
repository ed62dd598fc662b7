"""The ``attnid`` command: ``count``, ``audit``, ``presets``, ``train``, ``data``, ``experiments``, ``claims``
(``--json`` for machine output). One module per subcommand holds its parser beside its work (:mod:`.count`,
:mod:`.audit`, :mod:`.presets`, :mod:`.runs` for ``train``, ``data`` and ``experiments``, :mod:`.claims`), on the
helpers they share (:mod:`.common`); this module builds the parser and turns expected failures into exit codes."""

from __future__ import annotations

import argparse
import os
import sys

from .audit import audit_parser
from .claims import claims_parser
from .common import strict_json
from .count import count_parser
from .presets import presets_parser
from .runs import data_parser, experiments_parser, train_parser

__all__ = ["build_parser", "main", "strict_json"]


def build_parser() -> argparse.ArgumentParser:
    """The ``attnid`` argument parser: every subcommand (one function each, below) and its flags."""
    ap = argparse.ArgumentParser(prog="attnid", description="Parameter identification in attention layers.")
    sub = ap.add_subparsers(dest="command", required=True)
    parsers = (count_parser, audit_parser, train_parser, data_parser, experiments_parser, claims_parser)
    for add in (*parsers, presets_parser):
        add(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Expected failures print one line ``attnid: error: ...`` (2: bad input, 1: a check failed,
    130: interrupted); anything else is a bug and keeps its traceback."""
    from ..audit import CertificateError
    from ..hf import HFAuditError
    from ..lm.data import DataError
    from ..lm.launch import LaunchError, Stopped, sigterm_as_interrupt
    from ..lm.lifecycle import Interrupted
    from ..lm.records import RecordError, Refused

    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        with sigterm_as_interrupt():  # SIGTERM stops a command as Ctrl-C does, with its one line
            return a.func(a)
    except (ValueError, DataError, Refused) as e:
        print(f"attnid: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # an allocation the machine refused (the guards estimate; they can be overridden)
        print(f"attnid: error: {e or 'out of memory'}", file=sys.stderr)
        return 1
    except Stopped as e:  # a local suite stopped, its jobs with it
        print(f"attnid: {e}", file=sys.stderr)
        return 143 if e.signame == "SIGTERM" else 130
    except (RecordError, CertificateError, LaunchError, HFAuditError) as e:
        print(f"attnid: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of stdout went away (`| head`): what it read is what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # the machine said no: a read-only folder, a full disk, a missing program
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"attnid: error: {e.strerror or e}{where}; a run that stopped resumes when rerun", file=sys.stderr)
        return 1
    except Interrupted as e:
        print(f"attnid: {e}", file=sys.stderr)
        return 143 if e.signame == "SIGTERM" else 130
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
