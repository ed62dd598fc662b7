"""Project files: workflows lint clean, environment.yml agrees with pyproject.toml."""

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;@]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in py["dependencies"]}
    for extra in py["optional-dependencies"].values():
        declared |= {_name(r) for r in extra}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {_name(r) for r in pip if not r.startswith("-e")}
    assert listed == declared


def test_workflows_pass_actionlint():
    exe = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    assert exe, "actionlint is installed by the test extras"
    files = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    assert len(files) == 2
    r = subprocess.run([exe, "-shellcheck=", "-pyflakes=", *files], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ci_calls_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme.split("\n## ", 1)[0]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
