"""The book pipeline: execute every chapter (profile smoke) with papermill, build the book
strictly, check the execution cache, and open every page in headless Chromium. The book tool's other
behaviour (failing and dying kernels, stops, what its cache reads) is tests/test_book_tool.py's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from booktool import ROOT, RUNS, book, execute_here, need_chromium, statuses, tool

pytestmark = [pytest.mark.slow, pytest.mark.book]  # the whole file: it executes and builds the smoke book


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book") / "smoke"
    r = book("build", "--profile", "smoke", "--out", str(out), "--jobs", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    (out.parent / "build.stdout").write_text(r.stdout)
    return out


def test_toc_lists_every_chapter():
    toc = yaml.safe_load((ROOT / "book" / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    generated = {f.split("/", 1)[1] for f in files if f.startswith("_generated/")}
    sources = {p.stem for p in (ROOT / "notebooks").glob("*.py")}
    missing = sorted(sources - generated)
    assert not missing, (
        f"notebooks/ holds chapter(s) the book does not list: add `- file: _generated/{missing[0]}` to "
        "book/_toc.yml (a fork: under 'Experiments of your own')" + (f", and {missing[1:]}" if missing[1:] else "")
    )
    assert sources | {"reproducibility"} == generated, "book/_toc.yml lists a chapter that notebooks/ lacks"


def test_chapters_have_a_parameters_cell():
    for nb in (ROOT / "notebooks").glob("*.py"):
        text = nb.read_text()
        assert '# %% tags=["parameters"]' in text, nb
        cell = text.split('# %% tags=["parameters"]', 1)[1].split("# %%", 1)[0]
        for name in ("profile", "seed", "device"):
            assert re.search(rf"^{name} = ", cell, re.M), f"{nb.name}: no {name} in parameters"


def test_build_executes_every_chapter(smoke_book):
    """Every chapter executed once: those that train their runs find them trained by the tool beforehand."""
    stdout = (smoke_book.parent / "build.stdout").read_text()
    assert set(statuses(stdout).values()) == {"executed"} and "executing it again" not in stdout, stdout
    html = smoke_book / "_build" / "html"
    for nb in (ROOT / "notebooks").glob("*.py"):
        assert (html / "_generated" / f"{nb.stem}.html").exists()
        executed = (smoke_book / "_generated" / f"{nb.stem}.ipynb").read_text()
        assert '"profile": "smoke"' in executed and '"remove-cell"' in executed
    repro = (html / "_generated" / "reproducibility.html").read_text()
    assert "smoke" in repro and "torch" in repro


def test_pages_load_no_font_awesome_kit_and_icon_fonts_hold_the_icons_shown(smoke_book):
    """The theme's CSS draws the icons from web fonts; its 1.5 MB JavaScript kit is dropped from every page.
    The fonts and the stylesheet keep the icons the pages name, and only those (book/_ext/icon_fonts.py)."""
    import re

    from fontTools.ttLib import TTFont

    html = smoke_book / "_build" / "html"
    pages = list(html.rglob("*.html"))
    assert pages and not [p for p in pages if "fontawesome.js" in p.read_text()]
    assert not list((html / "_static").rglob("fontawesome.js"))
    css = (html / "_static" / "styles" / "pydata-sphinx-theme.css").read_text()
    assert "fa-solid-900.woff2" in css and ".fa-bars:before" in css and ".fa-bicycle:before" not in css
    fonts = html / "_static" / "vendor" / "fontawesome" / "webfonts"
    glyphs = set().union(*(TTFont(f).getBestCmap() for f in fonts.glob("*.woff2")))
    assert all(f.stat().st_size < 20_000 for f in fonts.glob("*.woff2"))  # the whole set: 0.3 MB
    shown = {n for p in pages for n in re.findall(r"\bfa-[a-z0-9-]+", p.read_text())}
    for name in ("fa-bars", "fa-magnifying-glass", "fa-github", "fa-moon", "fa-list"):
        assert name in shown
        cp = re.search(r"\." + name + r':before[^{]*\{content:"\\([0-9a-f]+)"', css)
        assert cp and int(cp[1], 16) in glyphs, name
    tip = re.search(r'--pst-icon-lightbulb:"(.)"', css)  # an icon the theme's CSS draws (tip admonitions)
    assert tip and ord(tip[1]) in glyphs


def test_pages_write_math_as_mathml_defer_scripts_and_size_lazy_figures(smoke_book):
    """A chapter with math and figures: every formula written as MathML at build time and no MathJax, every
    external script deferred but the one inline scripts read at once, every figure sized and lazy."""
    import re

    page = (smoke_book / "_build" / "html" / "_generated" / "02_invariances.html").read_text()
    assert "mathjax" not in page.lower().replace("mathjax_ignore", "")
    maths = re.findall(r'<(span|div) class="math notranslate nohighlight"[^>]*>(.*?)</\1>', page, re.S)
    assert len(maths) > 20 and all("<math" in m and "merror" not in m for _, m in maths)
    assert any('display="block"' in m for tag, m in maths if tag == "div")
    scripts = re.findall(r"<script[^>]*\ssrc=\"([^\"]+)\"[^>]*>", page)
    sync = [s for s in scripts if not re.search(r'<script[^>]*\b(defer|async)\b[^>]*src="' + re.escape(s), page)]
    assert sync and all("documentation_options.js" in s for s in sync), sync
    assert len(scripts) == len(set(scripts))  # none twice
    figures = re.findall(r"<img [^>]*_images/[^>]*>", page)
    assert figures and all('loading="lazy"' in f and re.search(r'width="\d+" height="\d+"', f) for f in figures)


def test_bibliography_entries_are_list_items(smoke_book):
    """docutils marks each citation ``role="doc-biblioentry"`` (deprecated, flagged by Lighthouse's accessibility
    audit) inside a ``role="list"``; book/_ext/book_fixes.py makes them list items."""
    page = (smoke_book / "_build" / "html" / "references.html").read_text()
    assert 'role="list"' in page and "doc-biblioentry" not in page
    assert page.count('class="citation" id=') == page.count('role="listitem"') > 5


def _book_extension(name: str):
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def test_mathml_writes_formulas_and_refuses_what_it_cannot_read():
    """book/_ext/mathml.py: TeX to MathML (⊤ as a symbol); a broken formula or an unknown command fails the
    build naming the formula, where MathJax would have drawn it red in the reader's browser."""
    from sphinx.errors import ExtensionError

    mathml = _book_extension("mathml")
    out = mathml.to_mathml(r"K^\top Q = W_K^\top W_Q", display=True)
    assert out.startswith("<math") and 'display="block"' in out and "<mi>&#x022A4;</mi>" in out
    assert "<mo>&#x022A4;</mo>" not in out
    for bad, said in ((r"x^", "cannot convert 'x^'"), (r"\rnak(A)", r"unknown command \rnak")):
        with pytest.raises(ExtensionError, match=re.escape(said)):
            mathml.to_mathml(bad)


def test_icon_css_keeps_the_icons_named_and_those_the_theme_draws():
    """book/_ext/icon_fonts.py on a small stylesheet: the rule of an icon no page names goes, the rule of one
    named stays, and an icon the theme's own CSS draws (a private-use character) is kept."""
    icons = _book_extension("icon_fonts")
    css = '.fa-bars:before,.fa-navicon:before{content:"\\f0c9"}.fa-bicycle:before{content:"\\f206"}'
    css += '.admonition{--pst-icon-tip:"\uf0eb"}'
    out, kept = icons.trimmed_css(css, {"fa-navicon", "fa-solid"})
    assert ".fa-bars:before" in out and ".fa-bicycle" not in out and "--pst-icon-tip" in out
    assert kept == {0xF0C9, 0xF0EB}
    assert icons.trimmed_css(css, {"fa-bicycle"})[1] == {0xF206, 0xF0EB}


def test_cache_skips_unchanged_and_reruns_after_src_change(smoke_book, tmp_path, monkeypatch):
    # `make chapter NB=...`: the named chapter re-executes, the others are left as they are, the book rebuilds
    r = book("build", "--profile", "smoke", "--out", str(smoke_book), "notebooks/01_definitions.py")
    assert r.returncode == 0, r.stderr[-3000:]
    assert statuses(r.stdout) == {"notebooks/01_definitions.py": "executed"} and "not executed in this" not in r.stdout
    # a change under src/ re-executes a chapter (one small notebook stands for them all)
    tiny = tmp_path / "tiny_chapter.py"
    tiny.write_text('# %% tags=["parameters"]\nprofile = "smoke"\nseed = 0\ndevice = "auto"\n\n# %%\nx = 1\n')
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))

    def tiny_status() -> str:
        return execute_here(monkeypatch, tiny, tmp_path / "b", src.resolve())

    assert (tiny_status(), tiny_status()) == ("executed", "cached")
    with open(src / "attnid" / "counting" / "attention.py", "a") as f:
        f.write("\n# an edit\n")
    assert tiny_status() == "executed"


# screenshots are for a person to look at, not part of the check: taken when ATTNID_SCREENSHOTS names a folder
# (a third of the check's time: every page drawn whole three times and written as PNG)
SCREENSHOTS = Path(os.environ["ATTNID_SCREENSHOTS"]) if os.environ.get("ATTNID_SCREENSHOTS") else None


def test_every_page_reads_well_in_chromium(smoke_book):
    """tools/check_pages.py on the smoke book: at 1300 px in light mode and (through the theme's switch) dark
    mode, code fits its box, images load and show at least 500 px wide, no console errors, no request leaves
    the machine, math is typeset, every chapter opens with a glued number; at 390 px the navigation opens, images fit
    and the page does not scroll sideways. With ATTNID_SCREENSHOTS set, screenshots of every page go there."""
    need_chromium()
    pages = tool("check_pages")
    check_book, pages_of = pages.check_book, pages.pages_of

    html = smoke_book / "_build" / "html"
    assert len(pages_of(html)) >= 10
    problems = check_book(html, SCREENSHOTS, jobs=2)
    assert not problems, "\n".join(problems)
    if SCREENSHOTS is not None:
        shots = list(SCREENSHOTS.glob("*.png"))
        assert len(shots) >= 3 * (len(pages_of(html)) - 1)  # light, dark and phone for every page


def test_the_sites_launch_and_repository_links_point_at_what_the_workflow_publishes(smoke_book, tmp_path, monkeypatch):
    """tools/publish.py on the smoke book, as the book workflow runs it: every Binder, Colab and repository link is
    formed from the configured repository and branch and names a notebook the site holds, beside the Binder
    environment (the CPU build of torch) and the committed records. Planted: a notebook missing, another repository."""
    import shutil

    publish = tool("publish")
    monkeypatch.setenv("ATTNID_RUNS", RUNS)  # the runs the smoke book was built with ride along
    cfg = yaml.safe_load((ROOT / "book" / "_config.yml").read_text())["repository"]
    copy = tmp_path / "smoke"
    shutil.copytree(smoke_book, copy)
    site = publish.prepare(copy, cfg["url"], "0" * 40)
    assert publish.check_links(site, cfg["url"], cfg["branch"]) == []
    env = yaml.safe_load((site / "environment.yml").read_text())
    pip = env["dependencies"][-1]["pip"]
    assert "torch==2.13.0+cpu" in pip and any("download.pytorch.org/whl/cpu" in p for p in pip)
    assert any(p.startswith("attnid[book] @ git+") for p in pip) and not any("test" in p for p in pip)
    assert (site / "start").stat().st_mode & 0o111 and (
        site / "data" / "runs" / "paper" / "sgd" / "summary.json"
    ).is_file()
    assert not list(site.rglob("*.pt"))  # records only, no weights
    first = json.loads((site / "_generated" / "01_definitions.ipynb").read_text())["cells"][0]
    assert "attnid-install" in first["metadata"]["tags"] and "remove-cell" in first["metadata"]["tags"]
    assert f"attnid[book] @ git+{cfg['url']}@{'0' * 40}" in "".join(first["source"])  # Colab installs this commit
    assert list((site / "data" / "runs" / "smoke").glob("*/summary.json"))  # the book's own runs ride along
    elsewhere = tmp_path / "downloaded-build"  # a build made elsewhere, under any name: its profile is given
    shutil.copytree(smoke_book, elsewhere)
    args = ["--profile", "smoke", "--repository", cfg["url"], "--commit", "0" * 40, "--build", str(elsewhere)]
    assert publish.main(args) == 0
    assert list((elsewhere / "_build" / "html" / "data" / "runs" / "smoke").glob("*/summary.json"))
    (site / "_generated" / "03_biases.ipynb").unlink()
    problems = publish.check_links(site, cfg["url"], cfg["branch"])
    assert any("names _generated/03_biases.ipynb, which the site does not hold" in p for p in problems), problems
    assert publish.check_links(site, "https://github.com/someone/fork", cfg["branch"])
    # the counter page's files ride along, each as the build wrote it
    counter = json.loads((site / "_counter" / "manifest.json").read_text())["files"]
    assert {"pyodide/pyodide.asm.wasm", "worker.js", "counter.js"} <= set(counter) and any(
        f.startswith("attnid-") for f in counter
    )
    (site / "_counter" / "pyodide" / "pyodide.asm.wasm").unlink()
    (site / "_counter" / "counter.js").write_text("// changed")
    problems = publish.check_counter(site)
    assert sorted(problems) == [
        "counter.html: _counter/counter.js is not the file the build wrote",
        "counter.html: _counter/pyodide/pyodide.asm.wasm is missing",
    ]
    assert set(problems) <= set(publish.check_links(site, cfg["url"], cfg["branch"]))


COUNTED = (  # the counter page's files: released ones as published and the book's, of every kind of model
    "released/llama-3.1-8b.json",  # GQA, scaled RoPE
    "released/qwen3-30b-a3b.json",  # QK-norm, experts
    "released/gpt-oss-20b.json",  # biases, sinks, sliding layers
    "released/phi-3-mini-4k-instruct.json",  # fused projections
    "gemma-3-12b.json",  # layer types, softcap-free QK-norm
    "deepseek-v3.json",  # latent attention
    "llama-4-scout.json",  # NoPE layers
)
SCOPES = ("attention", "block", "model")


def _cli_json(tmp: Path, name: str, text: str, scope: str) -> subprocess.CompletedProcess:
    """``attnid count --config NAME --scope SCOPE --json`` in its own process, on ``text`` saved as ``tmp/NAME``."""
    (tmp / name).write_text(text)
    cmd = [sys.executable, "-m", "attnid", "count", "--config", name, "--scope", scope, "--json"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)


def test_the_counter_page_counts_in_the_browser_what_the_command_prints(smoke_book, tmp_path):
    """The counter page (book/counter.md) in Chromium, served from 127.0.0.1: for seven shipped configs at every
    scope and a preset, the JSON the page shows is `attnid count --json`'s, and its table's total is the JSON's;
    a refused file, malformed JSON, an empty box and a 5 MB paste each give one line (the command's own where the
    command refuses) and leave the page counting; nothing leaves the machine and the console stays clean."""
    need_chromium()
    counter_page = tool("counter_page")
    with counter_page.served(smoke_book / "_build" / "html") as (browser, base):
        page = counter_page.CounterPage(browser, base, timeout_s=120)
        for file in COUNTED:
            text = (ROOT / "data" / "configs" / file).read_text()
            page.pick(f"config:configs/{file}")
            assert page.page.input_value("#counter-text") == text  # the box holds the file as shipped
            for scope in SCOPES:
                got = page.count(scope)
                want = json.loads(_cli_json(tmp_path, Path(file).name, text, scope).stdout)
                assert got["error"] is None and got["json"] == want, (file, scope)
                assert got["total"][:2] == ["total", f"{want['total_params']:,}"], (file, scope)
        page.pick("preset:llama-4-scout")
        got = page.count("model")
        cmd = [sys.executable, "-m", "attnid", "count", "--preset", "llama-4-scout", "--scope", "model", "--json"]
        assert got["json"] == json.loads(subprocess.run(cmd, capture_output=True, text=True).stdout)

        mine = tmp_path / "mine" / "my-model.json"  # a file of the reader's, opened: counted under its name
        mine.parent.mkdir()
        mine.write_text((ROOT / "data" / "configs" / "released" / "qwen3-8b.json").read_text())
        page.open_file(mine)
        got = page.count("block")
        assert got["json"] == json.loads(_cli_json(mine.parent, mine.name, mine.read_text(), "block").stdout)
        assert got["json"]["source"]["path"] == "my-model.json"

        refused = '{"model_type": "llama", "mlp_bias": true}'  # an MLP bias: refused for the decoder layer
        malformed = '{"model_type": "llama",'
        for text, scope in ((refused, "block"), (malformed, "attention"), ("x" * 5_000_000, "attention")):
            page.paste(text)
            got = page.count(scope)
            cli = _cli_json(tmp_path, "config.json", text, scope)
            assert cli.returncode == 2 and got["json"] is None
            assert got["error"] == cli.stderr.strip() and "\n" not in got["error"], got["error"][:300]
        page.paste("   ")
        assert page.count("attention")["error"].startswith("Nothing to count: paste a config.json")
        page.pick("config:configs/gpt2.json")  # still counting after all of that
        assert page.count("attention")["json"]["total_params"] == 2_362_368
        assert page.errors == [] and page.outside == []
        page.close()


def test_a_counter_page_whose_python_is_missing_says_so_and_stays_usable(smoke_book, tmp_path):
    """Planted: a site copied without Pyodide's module. Count answers with one line naming the failure (the button
    is usable again), instead of waiting forever."""
    need_chromium()
    html = tmp_path / "html"
    shutil.copytree(smoke_book / "_build" / "html", html)
    (html / "_counter" / "pyodide" / "pyodide.mjs").unlink()
    counter_page = tool("counter_page")
    with counter_page.served(html) as (browser, base):
        page = counter_page.CounterPage(browser, base, timeout_s=60)
        page.pick("preset:gpt2")
        got = page.count("attention")
        assert got["json"] is None and got["error"].startswith("The counter could not run"), got
        assert page.page.is_enabled("#counter-run")
