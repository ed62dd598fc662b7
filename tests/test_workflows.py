"""tools/run_workflow.py: a workflow's steps run in a fresh clone, in order, with the actions' local equivalents."""

import subprocess
from pathlib import Path

import yaml
from booktool import tool

STEPS = [
    {"uses": "actions/checkout@v7"},
    {"name": "write", "env": {"GREETING": "hello"}, "run": 'echo "${{ github.sha }} $GREETING $PROFILE" > out.txt'},
    {"name": "only on main", "if": "github.ref == 'refs/heads/main'", "run": "exit 3"},
    {"uses": "actions/upload-pages-artifact@v5", "with": {"path": "out.txt"}},
]


def _repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "committed.txt").write_text("in the clone\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    return repo


def _clean(out: str) -> None:
    """Remove the clones a run kept (their folders are printed as ``clone: PATH``)."""
    import shutil

    for line in out.splitlines():
        if line.startswith("clone: "):
            shutil.rmtree(Path(line.removeprefix("clone: ")).parent, ignore_errors=True)


def _run(tmp_path, repo, steps, *extra):
    wf = tmp_path / "wf.yml"
    wf.write_text(
        yaml.safe_dump({"name": "t", "on": "push", "env": {"PROFILE": "cpu"}, "jobs": {"j": {"steps": steps}}})
    )
    return tool("run_workflow").main([str(wf), "--repo", str(repo), "--keep", *extra])


def test_a_workflow_runs_in_a_fresh_clone_with_local_actions(tmp_path, capsys):
    repo = _repo(tmp_path)
    (repo / "uncommitted.txt").write_text("not in the clone")
    assert _run(tmp_path, repo, [*STEPS, {"name": "sees", "run": "test -f committed.txt && ! test -f uncommitted.txt"}],
                "--env", "PROFILE=smoke") == 0  # fmt: skip
    out = capsys.readouterr().out
    clone = out.rsplit("clone: ", 1)[1].strip()
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert Path(clone, "out.txt").read_text() == f"{sha} hello smoke\n"  # expressions, step env, an override
    assert "skipped  only on main" in out and "upload-pages-artifact: out.txt holds" in out
    _clean(out)


def test_a_failing_step_a_missing_upload_and_an_unknown_action_stop_the_run(tmp_path, capsys):
    repo = _repo(tmp_path)
    assert _run(tmp_path, repo, [*STEPS, {"name": "breaks", "run": "exit 4"}, {"run": "echo never"}]) == 1
    out = capsys.readouterr().out
    _clean(out)
    assert "FAILED   (exit 4) breaks" in out and "never" not in out.split("FAILED", 1)[1]
    missing = [{"uses": "actions/upload-pages-artifact@v5", "with": {"path": "build/site"}}]
    assert _run(tmp_path, repo, missing) == 1
    out = capsys.readouterr().out
    _clean(out)
    assert "nothing at build/site to upload" in out
    assert _run(tmp_path, repo, [{"uses": "someone/else@v1"}]) == 1
    out = capsys.readouterr().out
    _clean(out)
    assert "no local equivalent" in out
