"""Tiny Shakespeare at the character level (the corpus of nanoGPT's shakespeare-char).

The corpus is read from, in order: the ``path`` argument, the ``ATTNID_DATA`` environment
variable, or ``data/tinyshakespeare.txt`` under the project root (``$ATTNID_HOME``, else the checkout,
else the working directory; downloaded once from the canonical URL). Every source
is checked against the published sha256.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch

from .places import project_root

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
ENV = "ATTNID_DATA"


class DataError(RuntimeError):
    """The corpus is missing or corrupted; the message says how to fix it."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def corpus_path(path: str | os.PathLike | None = None, *, download: bool = True) -> Path:
    """Locate (and if needed download) the corpus; raise ``DataError`` with a fix if impossible."""
    if path is None and os.environ.get(ENV):
        path, source = os.environ[ENV], f"${ENV}"
        remedy = f"point {ENV} at a good copy of input.txt, or unset it to download from {URL}"
    else:
        source = "the path given (--path)"
        remedy = "give the path of a good copy of input.txt"
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise DataError(f"tiny Shakespeare not found at {p} (from {source}); {remedy}")
    else:
        source = "the download"
        remedy = f"delete it (it is downloaded again), or set {ENV} to a good copy"
        p = project_root() / "data" / "tinyshakespeare.txt"
        if not p.is_file():
            if not download:
                raise DataError(f"{p} is missing; set {ENV} to a local copy or allow the download")
            _download(p)
    digest = sha256(p)
    if digest != SHA256:
        raise DataError(
            f"{p} (from {source}) has sha256 {digest[:12]}…, expected {SHA256[:12]}…: the file is "
            f"corrupted or not tiny Shakespeare; {remedy}"
        )
    return p


def _download(dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    try:
        with urllib.request.urlopen(URL, timeout=60) as r, open(tmp, "wb") as f:
            f.write(r.read())
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DataError(
            f"could not download tiny Shakespeare from {URL} ({e}); without internet, set "
            f"{ENV} to a local copy of input.txt"
        ) from None
    os.replace(tmp, dest)


@dataclass
class CharData:
    """Encoded corpus, 90/10 train/val split, character vocabulary."""

    train: torch.Tensor
    val: torch.Tensor
    chars: list[str]

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def batch(
        self, split: str, batch_size: int, block_size: int, gen: torch.Generator, device: str | torch.device = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows ``(x, y)`` of shape ``(batch, block)``, ``y`` shifted by one; drawn from ``gen``."""
        data = self.train if split == "train" else self.val
        ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen)
        offs = torch.arange(block_size)
        x = data[ix[:, None] + offs]
        y = data[ix[:, None] + offs + 1]
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def load(path: str | os.PathLike | None = None) -> CharData:
    text = corpus_path(path).read_text(encoding="utf-8")
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(ids))
    return CharData(ids[:n], ids[n:], chars)
