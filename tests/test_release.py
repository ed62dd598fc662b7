"""The release: the wheel and sdist build and pass twine's check, the wheel installs into a fresh environment with no
torch, and the installed ``attnid`` counts; the release workflow runs here up to its upload and publishes with
trusted publishing only on a tag."""

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from booktool import ROOT, tool

pytestmark = pytest.mark.slow
RELEASE = ROOT / ".github" / "workflows" / "release.yml"


def test_the_wheel_installs_without_torch_and_counts(tmp_path):
    out = tmp_path / "release.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "check_release.py"), "--dist", str(tmp_path / "dist"),
                        "--json", str(out)], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(out.read_text())
    from attnid import __version__

    assert got["wheel"] == f"attnid-{__version__}-py3-none-any.whl" and got["sdist"] == f"attnid-{__version__}.tar.gz"
    assert "count --preset, count --config, presets: ok" in r.stdout


def test_a_tag_that_is_not_the_version_is_refused(capsys):
    assert tool("check_release").main(["--tag", "v0.0.0-not-it"]) == 1
    assert "does not name the package's version" in capsys.readouterr().err


def test_publishing_is_trusted_and_only_on_a_tag():
    wf = yaml.safe_load(RELEASE.read_text())
    publish = wf["jobs"]["publish"]
    assert publish["needs"] == "build" and publish["if"] == "github.ref_type == 'tag'"
    assert publish["permissions"] == {"id-token": "write"} and wf["permissions"] == {"contents": "read"}
    assert publish["steps"][-1]["uses"].startswith("pypa/gh-action-pypi-publish@")
    assert all("password" not in (s.get("with") or {}) for s in publish["steps"])  # no token: OIDC


def test_the_release_workflow_runs_here_up_to_its_upload(capsys):
    """Its build job in a fresh clone of HEAD: the tools it installs, the build, the checks, the upload's path."""
    assert tool("run_workflow").main([str(RELEASE), "--job", "build"]) == 0
    out = capsys.readouterr().out
    assert "upload-artifact: dist holds" in out and "ok       Build, check, install fresh" in out
    for line in out.splitlines():
        if line.startswith("clone: "):
            shutil.rmtree(line.removeprefix("clone: ").rsplit("/", 1)[0], ignore_errors=True)


def test_the_build_writes_nothing_into_the_checkout(tmp_path):
    """The build runs in a copy of the source (setuptools writes src/attnid.egg-info where it builds): tests beside
    it that watch the checkout see no change."""
    release = tool("check_release")
    before = {p: p.stat().st_mtime_ns for p in (ROOT / "src").rglob("*") if p.is_file()}
    release.build(tmp_path / "dist")
    after = {p: p.stat().st_mtime_ns for p in (ROOT / "src").rglob("*") if p.is_file()}
    assert {p: t for p, t in after.items() if before.get(p) != t and "__pycache__" not in p.parts} == {}
