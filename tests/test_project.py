"""Project files: workflows lint clean, environment.yml agrees with pyproject.toml."""

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;@]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in py["dependencies"]}
    for extra in py["optional-dependencies"].values():
        declared |= {_name(r) for r in extra if _name(r) != py["name"]}  # not the self-reference attnid[hf]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {_name(r) for r in pip if not r.startswith("-e")}
    assert listed == declared


def test_workflows_pass_actionlint():
    exe = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    assert exe, "actionlint is installed by the test extras"
    files = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    r = subprocess.run([exe, "-shellcheck=", "-pyflakes=", *files], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ci_calls_the_readme_test_command_and_the_smoke_books():
    """`.ci/run` and the CI workflow run the README's `make test` and `make test-book` (the tests `make test` leaves to
    it), which the README names too."""
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme.split("\n## ", 1)[0] and "`make test-book`" in readme.split("\n## ", 1)[0]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "make test" in ci and "make test-book" in ci
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert "run: make test TORCH_SPEC" in workflow and "run: make test-book TORCH_SPEC" in workflow
    makefile = (ROOT / "Makefile").read_text()
    assert '$(PYTEST) -m "not book"' in makefile and "-m book" in makefile


MATH_FLOORS = 4  # floors 1-4 of ARCHITECTURE.md are the math; the language-model side starts above them


def _import_graph() -> dict[str, set[str]]:
    """``module -> attnid modules it imports`` for every module under ``src/attnid``, lazy imports included."""
    import ast

    root = ROOT / "src" / "attnid"
    mods = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in root.rglob("*.py")}  # fmt: skip
    graph = {}
    for name, p in mods.items():
        pkg = name if p.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                cands = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                cands = [a.name for a in node.names]
            else:
                continue
            deps |= {c for c in cands if c in mods and c != name}
        graph[name] = deps
    return graph


def read_floors(text: str) -> dict[str, int]:
    """``module -> floor`` from the floors table of ARCHITECTURE.md: ``name/`` is a package and its modules,
    ``name/__init__`` the package module alone, ``name`` one module."""
    table = text.split("## Floors", 1)[1].split("\n## ", 1)[0]
    floors: dict[str, int] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        for entry in re.findall(r"`([^`]+)`", cells[1]):
            floors[entry] = int(cells[0])
    return floors


def floor_of(module: str, floors: dict[str, int]) -> int | None:
    """The floor of ``attnid.<module>`` in ``floors`` (:func:`read_floors`), or None where the map omits it."""
    rel = module.removeprefix("attnid").removeprefix(".").replace(".", "/") or "__init__"
    if rel in floors:
        return floors[rel]
    if f"{rel}/__init__" in floors:
        return floors[f"{rel}/__init__"]
    parts = rel.split("/")
    for i in range(len(parts), 0, -1):
        if "/".join(parts[:i]) + "/" in floors:
            return floors["/".join(parts[:i]) + "/"]
    return None


def layering_violations(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    """Modules the map omits, and imports that run up a floor."""
    out = [f"{m} is on no floor of ARCHITECTURE.md" for m in sorted(graph) if floor_of(m, floors) is None]
    for m in sorted(graph):
        for d in sorted(graph[m]):
            fm, fd = floor_of(m, floors), floor_of(d, floors)
            if fm is not None and fd is not None and fd > fm:
                out.append(f"{m} (floor {fm}) imports {d} (floor {fd})")
    return out


def test_every_import_runs_down_the_floors_of_the_map():
    """ARCHITECTURE.md's floors are the layering: every module is on one, and no import runs up."""
    floors = read_floors((ROOT / "ARCHITECTURE.md").read_text())
    assert len(set(floors.values())) >= 9
    assert layering_violations(_import_graph(), floors) == []


def test_the_layering_check_sees_an_import_up_and_a_module_off_the_map():
    """Planted: the real graph with one import that runs up (the layer importing the training loop) and one
    module the map does not name; the check reports both."""
    floors = read_floors((ROOT / "ARCHITECTURE.md").read_text())
    graph = _import_graph()
    graph["attnid.attention"] = graph["attnid.attention"] | {"attnid.lm.train"}
    graph["attnid.newroom"] = set()
    assert layering_violations(graph, floors) == [
        "attnid.newroom is on no floor of ARCHITECTURE.md",
        "attnid.attention (floor 2) imports attnid.lm.train (floor 6)",
    ]


def test_every_file_of_the_package_has_its_line_in_the_map():
    """Each file or package of ``src/attnid`` is named in ARCHITECTURE.md's file list."""
    text = (ROOT / "ARCHITECTURE.md").read_text().split("## Files", 1)[1].split("\n## ", 1)[0]
    root = ROOT / "src" / "attnid"
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        named = f"`{rel.as_posix()}`" in text or (len(rel.parts) > 1 and f"`{rel.parent.as_posix()}/`" in text)
        assert named, f"{rel} has no line in ARCHITECTURE.md"


def test_the_math_never_imports_the_language_model_side():
    """The floors of the math (``attnid``: attention, symmetries, counts, audits) stand alone: importing them
    loads nothing of ``attnid.lm``."""
    floors = read_floors((ROOT / "ARCHITECTURE.md").read_text())
    graph = _import_graph()
    math_side = [m for m in graph if (floor_of(m, floors) or 99) <= MATH_FLOORS]
    assert {"attnid.attention", "attnid.symmetry", "attnid.counting", "attnid.audit", "attnid.hf"} <= set(math_side)
    assert not [(m, d) for m in math_side for d in graph[m] if d.startswith("attnid.lm")]
    code = (
        "import sys, attnid, attnid.audit, attnid.dynamics, attnid.symmetry, attnid.presets, attnid.certify; "
        "print([m for m in sys.modules if m.startswith('attnid.lm')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_import_cycle_in_the_package():
    graph = _import_graph()
    assert {"attnid.families", "attnid.hf", "attnid.presets"} <= set(graph)
    done: set[str] = set()

    def visit(u: str, path: list[str]) -> None:
        for v in sorted(graph[u]):
            assert v not in path, "import cycle: " + " -> ".join([*path[path.index(v) :], v])
            if v not in done:
                visit(v, [*path, v])
        done.add(u)

    for u in sorted(graph):
        visit(u, [u])


def test_counting_and_presets_load_neither_transformers_nor_the_hf_module():
    code = (
        "import sys, attnid.cli, attnid.presets; attnid.presets.preset_count('llama-2-7b', 'model'); "
        "print([m for m in ('transformers', 'attnid.hf') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


MAX_CODE_LINES = 60  # non-blank lines in one chapter code cell
# non-blank lines in the code cells of each experimental chapter: the logic lives in attnid.chapters
CHAPTER_CODE_LINES = {"06_training_dynamics": 150, "07_heads": 100, "08_beyond_attention": 120}
FIGURE_CALL = re.compile(r"\bfig_\w+\(|plt\.show\(\)")


def chapter_code_lines(path: Path) -> list[int]:
    """Non-blank lines per code cell of a jupytext chapter."""
    import jupytext

    cells = jupytext.read(path).cells
    return [sum(1 for line in c.source.splitlines() if line.strip()) for c in cells if c.cell_type == "code"]


@pytest.mark.parametrize("chapter", sorted(CHAPTER_CODE_LINES))
def test_experimental_chapters_are_prose_and_calls(chapter):
    n = sum(chapter_code_lines(ROOT / "notebooks" / f"{chapter}.py"))
    assert n <= CHAPTER_CODE_LINES[chapter], f"{chapter}: {n} code lines"


def test_chapter_code_lines_are_counted(tmp_path):
    """The count sees code cells only: a markdown cell of any length adds nothing, a code line adds one."""
    import jupytext

    nb = jupytext.reads("# %%\nx = 1\n\ny = 2\n\n# %% [markdown]\n# text\n# more\n", fmt="py:percent")
    jupytext.write(nb, tmp_path / "probe.py", fmt="py:percent")
    assert chapter_code_lines(tmp_path / "probe.py") == [2]


def test_every_figure_cell_is_named_and_captioned_and_only_draws():
    """A cell that draws a figure (``plt.show()`` or a chapter module's ``fig_*``) carries a myst-nb figure name
    and caption (so the book can cite it) and ends with the figure: tables, checks and glued numbers go in
    another cell. No code cell exceeds MAX_CODE_LINES non-blank lines."""
    import jupytext

    for path in sorted((ROOT / "notebooks").glob("*.py")):
        for i, cell in enumerate(jupytext.read(path).cells):
            if cell.cell_type != "code":
                continue
            lines = [line for line in cell.source.splitlines() if line.strip()]
            assert len(lines) <= MAX_CODE_LINES, f"{path.name} cell {i}: {len(lines)} code lines"
            if FIGURE_CALL.search(cell.source):
                fig = cell.metadata.get("mystnb", {}).get("figure", {})
                assert fig.get("name") and fig.get("caption"), f"{path.name} cell {i}: a figure without name or caption"
                assert FIGURE_CALL.search(lines[-1]), f"{path.name} cell {i}: does more after its figure"


MAX_FUNCTION_LINES = 60


def test_long_functions_say_why_in_their_docstring():
    """No function in src/ runs over MAX_FUNCTION_LINES lines unless its docstring says why ("Long because")."""
    import ast

    long = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and "Long because" not in (ast.get_docstring(node) or ""):
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


def test_the_cpu_summary_adds_each_files_tests():
    """conftest.py's summary: each test's CPU seconds (on its teardown report) summed by file, other keys ignored."""
    from types import SimpleNamespace as R

    from conftest import CPU_KEY, cpu_by_file

    reports = [
        R(nodeid="tests/a.py::t1", user_properties=[(CPU_KEY, 1.5)]),
        R(nodeid="tests/a.py::t2[x]", user_properties=[(CPU_KEY, 2.0), ("other", 9.0)]),
        R(nodeid="tests/b.py::t", user_properties=[(CPU_KEY, 0.25)]),
        R(nodeid="tests/b.py::t", user_properties=[]),  # its call report
        "a warning",
    ]
    assert cpu_by_file(reports) == {"tests/a.py": 3.5, "tests/b.py": 0.25}


def test_every_test_security_md_names_exists():
    """SECURITY.md backs each promise with a test by name: each name it gives is a test function of the suite."""
    named = set(re.findall(r"\b(test_\w+)\b(?!\.py)", (ROOT / "SECURITY.md").read_text()))
    files = (ROOT / "tests").glob("test_*.py")
    defined = {m for p in files for m in re.findall(r"^def (test_\w+)", p.read_text(), re.M)}
    assert len(named) >= 20
    assert sorted(named - defined) == []


def test_the_readme_is_a_front_page_and_its_reference_is_in_the_book():
    """README: at most 150 lines, the two set-up commands in its first code block, and each reference page it
    links to is a page of the book's Reference part (its source in book/reference/, listed in the toc)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    first = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first.splitlines()] == ["make book", "make test"]
    linked = set(re.findall(r"attnid\.github\.io/attnid/reference/(\w+)\.html", readme))
    pages = {p.stem for p in (ROOT / "book" / "reference").glob("*.md")}
    toc = yaml.safe_load((ROOT / "book" / "_toc.yml").read_text())
    listed = {
        c["file"].split("/", 1)[1]
        for part in toc["parts"]
        for c in part["chapters"]
        if c["file"].startswith("reference/")
    }
    assert linked == pages == listed and len(pages) >= 6


def test_the_reference_lists_the_exit_codes_the_command_uses():
    from attnid.cli.commands import EXIT_CODES

    page = (ROOT / "book" / "reference" / "command_line.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", page, re.M)
    codes = re.findall(r"^  (\d+) +(.+)$", EXIT_CODES, re.M)
    assert rows == codes and len(codes) == 5
