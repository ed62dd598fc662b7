"""The ``attnid`` subcommands as plain data (:mod:`attnid.cli`): each one's module, one-line help, description and
examples, and the exit codes every subcommand uses. Nothing here imports torch, so ``attnid --help`` and
``attnid --version`` answer at once."""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One subcommand: the module of :mod:`attnid.cli` that holds its parser and its work, its one-line ``help``,
    its ``description``, its ``examples`` (one command a line) and the ``extra`` it needs ("": none, the core)."""

    module: str
    help: str
    description: str
    examples: tuple[str, ...]
    extra: str = ""  # the extra it needs (attnid.extras.EXTRAS); "": the core


COMMANDS: dict[str, Command] = {
    "count": Command(
        ".count",
        "closed-form parameter and unidentified counts (no torch work, no GPU)",
        "Count an attention layer's parameters and the unidentified ones from the closed forms of the paper's §4: an "
        "architecture given by its flags, a published preset, or your model's config.json, at the scope of one "
        "attention layer, one decoder layer or the whole model.",
        ("attnid count --embed 768 --heads 12 --bias all",
         "attnid count --preset llama-2-7b --scope model",
         "attnid count --config path/to/config.json --scope model --json"),
    ),
    "audit": Command(
        ".audit",
        "numerical count: #params − rank of the Jacobian, against the closed form",
        "Audit a layer numerically: the rank of the Jacobian of its output with respect to its parameters, on random "
        "inputs, gives the unidentified count, compared with the closed form. Our own layer by its flags, a real "
        "transformers module (--hf), your config's structure (--config), a trained run (--run) or a transformers "
        "checkpoint (--checkpoint).",
        ("attnid audit --embed 16 --heads 4 --bias all --causal",
         "attnid audit --hf llama --embed 32 --heads 4 --groups 2 --json",
         "attnid audit --config path/to/config.json --block",
         "attnid audit --run data/runs/cpu/adamw"),
        extra="audit",
    ),
    "presets": Command(
        ".presets",
        "the published architectures at three scopes (--verify: through their real modules)",
        "List the published architectures attnid knows, with their parameter totals and unidentified counts for "
        "one attention layer, one decoder layer and the whole model; --verify audits each one's structure through "
        "its transformers module.",
        ("attnid presets", "attnid presets --verify --json"),
    ),
    "train": Command(
        ".runs",
        "train one case of chapter 6 (resumes or reuses its run record)",
        "Train one case of chapter 6 (nanoGPT on tiny Shakespeare, probed every few steps) into its run record; an "
        "interrupted run resumes from its checkpoint and a finished one is reused (--force: start over).",
        ("attnid train --profile cpu --case adamw", "attnid train --profile smoke --case sgd --seed 1 --json"),
        extra="train",
    ),
    "data": Command(
        ".runs",
        "locate (or download) and verify the tiny Shakespeare corpus",
        "Find the corpus ($ATTNID_DATA, or the project's data folder), download it if it is missing and internet is "
        "available, and verify its sha256.",
        ("attnid data", "attnid data --path ~/input.txt --json"),
        extra="train",
    ),
    "experiments": Command(
        ".runs",
        "train every run of a suite (chapter 6 or 7), inline, stacked or through submitit",
        "Train every case and seed of a suite at a profile: one after another in this process, as stacked models on "
        "one GPU (--stacked), or one submitit job per run (--launcher local or slurm). Finished runs are reused.",
        ("attnid experiments --profile cpu", "attnid experiments --profile cpu --suite heads",
         "attnid experiments --profile paper --device cuda --stacked"),
        extra="train",
    ),
    "claims": Command(
        ".claims",
        "the paper's §5 claims, evaluated on the run records found (trains nothing)",
        "Evaluate the paper's §5 claims (and the book's own) on the run records found: each claim's value per seed, "
        "its threshold and control, and a verdict (yes, no, inconclusive, pending).",
        ("attnid claims --profile mid", "attnid claims --profile cpu --seed-set 0,1,2 --json",
         "attnid claims --profile paper --runs my_runs --with-committed"),
        extra="train",
    ),
}  # fmt: skip

EXIT_CODES = """exit codes:
  0    done; an audit or verification whose count equals the closed form
  1    a check failed: an audit against its closed form, a damaged record, a launcher's job
  2    bad input: a flag, file, folder or config refused (one line says which, and the fix)
  130  interrupted (Ctrl-C): finished runs and records are kept, and the same command resumes
  143  stopped by SIGTERM, as 130"""


def add_command(sub, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name`` under ``sub``, with its help, description and examples."""
    c = COMMANDS[name]
    return sub.add_parser(
        name,
        help=c.help,
        description=textwrap.fill(c.description, 100),
        epilog="examples:\n" + "\n".join(f"  {e}" for e in c.examples) + "\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
