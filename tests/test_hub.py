"""A model named on the Hub (``count --config ORG/NAME[@REVISION]``): read offline from a cache laid out as
huggingface_hub lays it out, its repository, revision and commit reported; each failure the library raises (gated,
not found, no such revision, no config.json, offline without a copy, no network, a refused token) is one line and
exit 2. Nothing here reaches the network: HF_HUB_OFFLINE is set, or the download function raises."""

import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("huggingface_hub")

import huggingface_hub
from booktool import ROOT
from huggingface_hub import errors

from attnid.cli import main

httpx = pytest.importorskip("httpx2" if huggingface_hub.__version__ >= "2" else "httpx")  # its errors' responses

RELEASED = ROOT / "data" / "configs" / "released" / "llama-3.1-8b.json"
COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
OTHER = "1111111111111111111111111111111111111111"
REPO = "meta-llama/Llama-3.1-8B"


def hub_cache(root, repo: str = REPO, refs: dict | None = None) -> str:
    """A Hub cache holding ``repo``'s config.json as the library stores it: the file under blobs/ (named by a
    digest), linked from snapshots/<commit>/, and refs/<branch> naming the commit."""
    refs = refs or {"main": COMMIT}
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "blobs").mkdir(parents=True)
    for i, (branch, commit) in enumerate(refs.items()):
        blob = folder / "blobs" / f"{i:040x}"
        shutil.copy(RELEASED, blob)
        snap = folder / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        (snap / "config.json").symlink_to(os.path.relpath(blob, snap))
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / branch).write_text(commit)
    return str(root)


def attnid(*args, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnid", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env})  # fmt: skip


def test_a_model_name_reads_the_cached_config_offline_and_says_which_commit(tmp_path):
    env = {"HF_HUB_CACHE": hub_cache(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    r = attnid("count", "--config", REPO, "--scope", "model", "--json", env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["source"]["repo"] == REPO and got["source"]["commit"] == COMMIT and got["source"]["revision"] is None
    local = json.loads(attnid("count", "--config", str(RELEASED), "--scope", "model", "--json", env={}).stdout)
    assert (got["total_params"], got["unidentified"]) == (local["total_params"], local["unidentified"])
    r = attnid("count", "--config", REPO, env=env)
    assert r.returncode == 0 and f"read from {REPO} (commit {COMMIT[:12]}, from the Hub)" in r.stdout


def test_a_revision_is_a_branch_or_a_commit(tmp_path):
    env = {"HF_HUB_CACHE": hub_cache(tmp_path / "hub", refs={"main": COMMIT, "v2": OTHER}), "HF_HUB_OFFLINE": "1"}
    for rev, commit in (("v2", OTHER), (COMMIT, COMMIT)):
        r = attnid("count", "--config", f"{REPO}@{rev}", "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["source"] == {"path": json.loads(r.stdout)["source"]["path"], "repo": REPO,
                                                  "revision": rev, "commit": commit}  # fmt: skip


def test_offline_without_a_cached_copy_is_one_line(tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    r = attnid("count", "--config", REPO, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "not in the local Hub cache and HF_HUB_OFFLINE is set" in r.stderr


def test_a_local_path_wins_over_a_name(tmp_path, monkeypatch, capsys):
    (tmp_path / "meta-llama" / "Llama-3.1-8B").mkdir(parents=True)
    shutil.copy(RELEASED, tmp_path / "meta-llama" / "Llama-3.1-8B" / "config.json")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("the Hub was asked"))
    assert main(["count", "--config", REPO, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"]["repo"] is None


def _http(cls, status: int, message: str):
    request = httpx.Request("GET", f"https://huggingface.co/{REPO}/resolve/main/config.json")
    return cls(message, response=httpx.Response(status, request=request))


def _offline():
    e = errors.LocalEntryNotFoundError("Cannot find the requested files in the disk cache")
    e.__cause__ = errors.OfflineModeIsEnabled("offline")
    return e


def _no_network():
    e = errors.LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub")
    e.__cause__ = ConnectionError("Name or service not known")
    return e


@pytest.mark.parametrize(
    ("raised", "says"),
    [
        (lambda: _http(errors.GatedRepoError, 403, "Access restricted"), "is gated: accept its terms"),
        (lambda: _http(errors.RepositoryNotFoundError, 404, "Repository Not Found"), "no model meta-llama/"),
        (lambda: _http(errors.RevisionNotFoundError, 404, "Revision Not Found"), "has no revision"),
        (lambda: _http(errors.RemoteEntryNotFoundError, 404, "Entry Not Found"), "has no config.json"),
        (_offline, "HF_HUB_OFFLINE is set"),
        (_no_network, "the Hub could not be reached"),
        (lambda: _http(errors.HfHubHTTPError, 401, "Invalid credentials"), "refused the token"),
        (lambda: _http(errors.HfHubHTTPError, 500, "Internal Error"), "the Hub answered 500"),
    ],
    ids=["gated", "not-found", "revision", "no-config", "offline", "network", "token", "server"],
)
def test_each_failure_of_the_hub_is_one_line_naming_the_fix(monkeypatch, capsys, raised, says):
    def download(*a, **k):
        raise raised()

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", says == "HF_HUB_OFFLINE is set")
    assert main(["count", "--config", f"{REPO}@v1", "--scope", "model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and err.startswith("attnid: error: config: "), err


@pytest.mark.parametrize("source", ["no/such/path.json", "./missing", "not a name", "org/name@"])
def test_neither_a_path_nor_a_name_is_one_line(capsys, source):
    assert main(["count", "--config", source]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither a config.json" in err


def test_without_the_hub_extra_a_name_names_the_extra(tmp_path):
    code = (
        "import sys; sys.modules['huggingface_hub'] = None\nfrom attnid.cli import main\nsys.exit(main(sys.argv[1:]))"
    )
    r = subprocess.run([sys.executable, "-c", code, "count", "--config", REPO], capture_output=True, text=True,
                       cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2 and "pip install 'attnid[hub]'" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_the_python_api_takes_a_name(tmp_path, monkeypatch):
    from attnid import count_config, load_config

    monkeypatch.setenv("HF_HUB_CACHE", hub_cache(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    p = load_config(REPO)
    assert p.origin.repo == REPO and p.origin.commit == COMMIT and REPO in p.description
    assert count_config(REPO, scope="model").total_params == 8_030_261_248
