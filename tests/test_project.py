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


def test_ci_calls_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme.split("\n## ", 1)[0]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_math_never_imports_the_language_model_side():
    """``attnid`` (attention, symmetries, counts, audit, dynamics) stands alone; ``attnid.lm`` builds on it."""
    import ast

    math_side = [p for p in (ROOT / "src" / "attnid").glob("*.py") if p.name not in ("cli.py", "__main__.py")]
    assert {p.stem for p in math_side} >= {"attention", "symmetry", "counting", "audit", "dynamics", "rope"}
    for path in math_side:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = ("." * node.level) + (node.module or "")
                assert not target.startswith((".lm", "attnid.lm")), f"{path.name} imports {target}"
                assert not (node.level == 1 and node.module is None and any(a.name == "lm" for a in node.names))
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("attnid.lm") for a in node.names), path.name
    code = (
        "import sys, attnid, attnid.audit, attnid.dynamics, attnid.symmetry, attnid.presets; "
        "print([m for m in sys.modules if m.startswith('attnid.lm')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


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
