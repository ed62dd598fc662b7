"""The counter page's Python (attnid.browser) and its build (book/_ext/counter.py), in CPython: the page's Count is
``attnid count`` itself, numbers, JSON and refusals; the files the build writes are the package's and the pinned
Pyodide's, and a tarball that is not the pinned one is refused. The page in a browser: tests/test_book.py."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from booktool import ROOT

from attnid.browser import PASTED, count_page, file_name, manifest

CONFIGS = ROOT / "data" / "configs"


def counter_build():
    spec = importlib.util.spec_from_file_location("counter_build", ROOT / "book" / "_ext" / "counter.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def command(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """``attnid ARGS`` in its own process, in ``tmp``."""
    return subprocess.run([sys.executable, "-m", "attnid", *args], capture_output=True, text=True, cwd=tmp)


@pytest.mark.parametrize(
    ("file", "scope"),
    [("released/llama-3.1-8b.json", "attention"), ("deepseek-v3.json", "block"), ("gemma-3-12b.json", "model")],
)
def test_the_page_counts_what_the_command_prints(tmp_path, file, scope):
    text = (CONFIGS / file).read_text()
    name = Path(file).name
    page = json.loads(count_page(scope, text, name))
    (tmp_path / name).write_text(text)
    as_json = command(tmp_path, "count", "--config", name, "--scope", scope, "--json")
    printed = command(tmp_path, "count", "--config", name, "--scope", scope)
    assert page["status"] == 0 and page["error"] == ""
    assert page["json"] == json.loads(as_json.stdout)  # every number, the reading and the source
    assert page["text"] == printed.stdout
    assert page["command"] == f"attnid count --config {name} --scope {scope}"


def test_a_preset_is_counted_as_the_command_counts_it(tmp_path):
    page = json.loads(count_page("model", preset="qwen3-8b"))
    r = command(tmp_path, "count", "--preset", "qwen3-8b", "--scope", "model", "--json")
    assert page["json"] == json.loads(r.stdout) and page["command"] == "attnid count --preset qwen3-8b --scope model"


@pytest.mark.parametrize(
    "text",
    [
        "{",  # not JSON
        "",  # empty
        '{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 3}',  # heads that do not divide
        '{"model_type": "no_such_family"}',
    ],
)
def test_a_refused_file_gets_the_commands_own_line(tmp_path, text):
    page = json.loads(count_page("attention", text))
    (tmp_path / PASTED).write_text(text)
    r = command(tmp_path, "count", "--config", PASTED)
    assert r.returncode == page["status"] == 2 and page["json"] is None
    assert page["error"] == r.stderr.strip() and page["error"].startswith("attnid: error: config: ")
    assert "\n" not in page["error"]


def test_a_dropped_files_name_is_kept_safe():
    assert file_name("C:\\Users\\me\\my model.json") == "my_model.json"
    assert file_name("../../etc/passwd") == "passwd"
    assert file_name("..") == PASTED and file_name("") == PASTED
    assert len(file_name("a" * 500 + ".json")) == 80


def test_the_page_asks_for_one_thing_at_a_known_scope():
    with pytest.raises(ValueError, match="scope must be one of"):
        count_page("layer", "{}")
    with pytest.raises(ValueError, match="not both"):
        count_page("attention", "{}", preset="gpt2")
    with pytest.raises(ValueError, match="not both"):
        count_page("attention")


def test_the_manifest_lists_every_preset_and_the_versions():
    from attnid import __version__
    from attnid.library_configs import supported_version
    from attnid.presets import MLA_PRESETS, PRESETS

    m = manifest()
    assert [p["name"] for p in m["presets"]] == [*PRESETS, *MLA_PRESETS] and "deepseek-v3" in MLA_PRESETS
    for p in m["presets"]:  # each preset the page lists counts, at the scope the page opens with
        assert json.loads(count_page("attention", preset=p["name"]))["status"] == 0, p["name"]
    assert (m["attnid"], m["transformers"]) == (__version__, supported_version())


def fake_pyodide(tmp_path: Path, build, missing: str = "") -> Path:
    """A tarball laid out as the npm package, with a few bytes for each file a browser loads."""
    path = tmp_path / "pyodide.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for name in build.PYODIDE_FILES:
            if name != missing:
                data = f"// {name}".encode()
                info = tarfile.TarInfo(f"package/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def test_the_build_writes_the_package_the_pinned_pyodide_and_a_manifest_of_both(tmp_path, monkeypatch):
    build = counter_build()
    tgz = fake_pyodide(tmp_path, build)
    monkeypatch.setenv("ATTNID_PYODIDE", str(tgz))
    monkeypatch.setattr(build, "PYODIDE_INTEGRITY", build._integrity(tgz.read_bytes()))
    m = build.write_counter(tmp_path / "html", ROOT / "book" / "_counter")
    out = tmp_path / "html" / "_counter"
    assert set(m["files"]) == {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {"manifest.json"}
    for rel, f in m["files"].items():
        data = (out / rel).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (f["bytes"], f["sha256"])
    assert json.loads((out / "manifest.json").read_text()) == m
    assert {"counter.js", "worker.js", *(f"pyodide/{n}" for n in build.PYODIDE_FILES)} <= set(m["files"])
    # the package's sources, every module and its data, and nothing else
    package = ROOT / "src" / "attnid"
    with zipfile.ZipFile(out / m["package"]) as z:
        names = set(z.namelist())
        assert z.read("attnid/library_configs.json") == (package / "library_configs.json").read_bytes()
    assert names == {
        f"attnid/{p.relative_to(package).as_posix()}"
        for p in package.rglob("*")
        if p.suffix in (".py", ".json") and "__pycache__" not in p.parts
    }
    assert build.package_zip(package) == (out / m["package"]).read_bytes()  # the same sources, the same bytes
    released = [c for c in m["configs"] if c["group"] == "released"]
    assert len(released) == len(list((CONFIGS / "released").glob("*.json"))) - 1  # all but SOURCES.json
    families = [c for c in m["configs"] if c["group"] == "families"]
    assert sorted(c["name"] for c in families) == sorted(p.name for p in (CONFIGS / "families").glob("*.json"))


def test_the_build_refuses_a_pyodide_that_is_not_the_pinned_one(tmp_path, monkeypatch):
    build = counter_build()
    monkeypatch.setenv("ATTNID_PYODIDE", str(fake_pyodide(tmp_path, build)))
    with pytest.raises(build.CounterBuildError, match="sha512 differs from the registry's"):
        build.pyodide_tarball()
    tgz = fake_pyodide(tmp_path, build, missing="pyodide.asm.wasm")
    with pytest.raises(build.CounterBuildError, match=r"has no pyodide\.asm\.wasm"):
        build.pyodide_files(tgz.read_bytes())
    monkeypatch.setenv("ATTNID_PYODIDE", str(tmp_path / "nowhere.tgz"))
    with pytest.raises(build.CounterBuildError, match=r"ATTNID_PYODIDE=.*no such file"):
        build.pyodide_tarball()


def test_a_build_without_npm_says_what_to_install(tmp_path, monkeypatch):
    build = counter_build()
    monkeypatch.delenv("ATTNID_PYODIDE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no cached copy
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(build.CounterBuildError, match=r"install Node\.js's npm, or set ATTNID_PYODIDE"):
        build.pyodide_tarball()
