"""Where a config comes from: a local ``config.json`` (or a folder holding one), or a model on the Hugging Face Hub by
its name, ``ORG/NAME`` or ``ORG/NAME@REVISION``, of which only ``config.json`` is fetched, through ``huggingface_hub``
(its cache, ``HF_HOME``, ``HF_HUB_OFFLINE`` and ``HF_TOKEN`` as the library reads them; the ``hub`` extra). A local
path that exists wins over a name. Every failure is one line naming the fix (:class:`HubError`, exit 2)."""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from .extras import require
from .inputs import printable

# a repository id as the Hub spells it (an owner, a name), with an optional revision: a branch, tag or commit
HUB_NAME = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})(@(?P<revision>[\w./-]{1,255}))?")
LOGIN = "log in with `hf auth login` or set HF_TOKEN"


class HubError(ValueError):
    """A config that cannot be had from the Hub: the message says why and what to do, in one line."""


@dataclass(frozen=True)
class ConfigSource:
    """The config file read: its ``path`` here; for a model on the Hub, its ``repo``, the ``revision`` asked for
    (``None``: the default branch) and the ``commit`` whose file was read."""

    path: Path
    repo: str | None = None
    revision: str | None = None
    commit: str | None = None

    def as_dict(self) -> dict:
        return {**asdict(self), "path": str(self.path)}

    def describe(self) -> str:
        """One phrase: the path, or ``ORG/NAME@REVISION (commit abcdef123456)``."""
        if self.repo is None:
            return str(self.path)
        at = f"@{self.revision}" if self.revision else ""
        return f"{self.repo}{at} (commit {self.commit[:12] if self.commit else 'unknown'}, from the Hub)"


def locate_config(source: str | Path, revision: str | None = None) -> ConfigSource:
    """The config ``source`` names: a local file or folder when it exists, else a Hub name ``ORG/NAME[@REVISION]``
    (``revision`` given apart overrides none written in the name); :class:`HubError` when neither."""
    path = Path(source).expanduser()
    if path.exists():
        if revision is not None:
            raise HubError(f"config: a revision applies to a model on the Hub, and {printable(str(source), 80)} is "
                           "a local path")  # fmt: skip
        return ConfigSource(path)
    m = HUB_NAME.fullmatch(str(source))
    if m is None or str(source).startswith((".", "/", "~")) or str(source).endswith(".json"):
        raise HubError(f"config: {printable(str(source), 120)} is neither a config.json (or a folder holding one) "
                       "here nor a model name ORG/NAME[@REVISION] on the Hub")  # fmt: skip
    if m.group("revision") and revision is not None and revision != m.group("revision"):
        raise HubError(f"config: two revisions given ({m.group('revision')!r} in the name, {revision!r} apart)")
    return fetch_config(m.group("repo"), revision or m.group("revision"))


def fetch_config(repo: str, revision: str | None = None) -> ConfigSource:
    """``config.json`` of model ``repo`` at ``revision``, from the Hub or the local cache (``hf_hub_download``)."""
    require("hub", f"reading {repo} from the Hub", ("huggingface_hub",))
    from huggingface_hub import constants, errors, hf_hub_download

    at = f" at revision {revision!r}" if revision else ""
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # its retries' notes: the outcome is one line
    try:
        path = Path(hf_hub_download(repo, "config.json", revision=revision))
    except errors.GatedRepoError:
        raise HubError(
            f"config: {repo} is gated: accept its terms on https://huggingface.co/{repo}, then {LOGIN}"
        ) from None
    except errors.RepositoryNotFoundError:
        raise HubError(f"config: no model {repo} on the Hub (a private one needs your token: {LOGIN})") from None
    except errors.RevisionNotFoundError:
        raise HubError(f"config: {repo} has no revision {revision!r} (a branch, a tag or a commit hash)") from None
    except errors.LocalEntryNotFoundError as e:  # not cached, and the Hub not reached (offline, or no network)
        if constants.HF_HUB_OFFLINE or isinstance(e.__cause__, errors.OfflineModeIsEnabled):
            raise HubError(f"config: {repo}{at} is not in the local Hub cache and HF_HUB_OFFLINE is set: unset it "
                           "to download, or pass the path of a config.json") from None  # fmt: skip
        raise HubError(f"config: the Hub could not be reached for {repo}{at} and it is not in the local cache: "
                       "check the network (or HF_ENDPOINT), or pass the path of a config.json") from None  # fmt: skip
    except errors.EntryNotFoundError:  # the repository has no config.json (a dataset, a GGUF-only upload)
        raise HubError(f"config: {repo}{at} has no config.json (a transformers model has one)") from None
    except errors.HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status == 401:
            raise HubError(f"config: the Hub refused the token for {repo} (401): {LOGIN} again") from None
        raise HubError(
            f"config: the Hub answered {status or 'an error'} for {repo}{at}: "
            f"{printable(str(e).splitlines()[0] if str(e) else type(e).__name__, 120)}"
        ) from None
    except errors.HFValidationError as e:
        raise HubError(f"config: {printable(repo, 80)} is not a valid model name: {printable(e, 120)}") from None
    except OSError as e:  # a connection that broke, a cache folder that cannot be written
        raise HubError(f"config: {repo}{at} could not be fetched ({printable(e.strerror or e, 120)}): check the "
                       "network and the cache folder (HF_HOME)") from None  # fmt: skip
    return ConfigSource(path, repo, revision, _commit_of(path))


def _commit_of(path: Path) -> str | None:
    """The commit a file of the Hub's cache was downloaded at: ``.../snapshots/<commit>/config.json``."""
    parent = path.parent
    return parent.name if parent.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", parent.name) else None
