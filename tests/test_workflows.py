"""tools/run_workflow.py: a workflow's steps run in a fresh clone, in order, with the actions' local equivalents."""

import subprocess
from pathlib import Path

import pytest
import yaml
from booktool import tool

STEPS = [
    {"uses": "actions/checkout@v7"},
    {
        "name": "write",
        "env": {"GREETING": "hello"},
        "run": 'echo "${{ github.sha }} $GREETING $PROFILE" > out.txt && cp out.txt "$PROFILE.txt"',
    },
    {"name": "only on main", "if": "github.ref == 'refs/heads/main'", "run": "exit 3"},
    {"uses": "actions/upload-pages-artifact@v5", "with": {"path": "out.txt"}},
    {"uses": "actions/upload-artifact@v7", "with": {"path": "${{ env.PROFILE }}.txt", "if-no-files-found": "error"}},
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
    assert "upload-artifact: smoke.txt holds" in out  # an action's input filled with the overridden env
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


def test_expressions_of_the_projects_workflows_have_local_values(tmp_path, capsys):
    """paper-records.yml's `inputs.force && '--force' || ''`: GitHub's first truthy or falsy operand."""
    repo = _repo(tmp_path)
    step = {"name": "flag", "env": {"FORCE": "${{ inputs.force && '--force' || '' }}"},
            "run": 'echo "[$FORCE]" > flag.txt'}  # fmt: skip
    for value, written in (("true", "[--force]"), ("false", "[]")):
        assert _run(tmp_path, repo, [step], "--input", f"force={value}") == 0
        out = capsys.readouterr().out
        clone = out.rsplit("clone: ", 1)[1].strip()
        assert Path(clone, "flag.txt").read_text().strip() == written
        _clean(out)


@pytest.mark.parametrize(
    ("steps", "says"),
    [
        ([{"run": "echo ${{ contains(github.ref, 'main') }}"}], "the expression \"contains(github.ref, 'main')\""),
        ([{"run": "echo hi", "shell": "pwsh"}], "shell 'pwsh' not emulated"),
        ([{"run": "echo hi", "continue-on-error": True}], "continue-on-error not emulated"),
    ],
)
def test_what_the_runner_does_not_emulate_is_refused_by_name_and_its_clone_removed(tmp_path, capsys, steps, says):
    repo = _repo(tmp_path)
    assert _run(tmp_path, repo, steps) == 2
    captured = capsys.readouterr()
    assert says in captured.err and "Traceback" not in captured.err
    removed = captured.out.rsplit("clone removed: ", 1)[1].strip()
    assert not Path(removed).exists()


def test_a_step_runs_in_its_working_directory_and_jobs_in_the_order_their_needs_give(tmp_path, capsys):
    repo = _repo(tmp_path)
    (repo / "sub").mkdir()
    (repo / "sub" / "here.txt").write_text("x")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "two"],
                   check=True)  # fmt: skip
    wf = tmp_path / "wf.yml"
    wf.write_text(yaml.safe_dump({"name": "t", "on": "push", "jobs": {
        "second": {"needs": "first", "steps": [{"run": "test -f ../first.txt && echo 2 >> ../order.txt",
                                                "working-directory": "sub"}]},
        "first": {"steps": [{"run": "test -f here.txt && touch ../first.txt && echo 1 > ../order.txt",
                             "working-directory": "sub"}]}}}))  # fmt: skip
    assert tool("run_workflow").main([str(wf), "--repo", str(repo), "--keep"]) == 0
    out = capsys.readouterr().out
    clone = out.rsplit("clone: ", 1)[1].strip()
    assert Path(clone, "order.txt").read_text().split() == ["1", "2"]
    _clean(out)


def test_a_push_never_reaches_the_cloned_repository_and_inputs_hold_no_shell(tmp_path, capsys):
    repo = _repo(tmp_path)
    push = {
        "run": "git -c user.name=t -c user.email=t@t commit -q --allow-empty -m x && git push -q origin HEAD:pushed"
    }
    branches = ["git", "-C", str(repo), "branch", "--list", "pushed"]
    assert _run(tmp_path, repo, [push]) == 1
    _clean(capsys.readouterr().out)
    assert subprocess.run(branches, capture_output=True, text=True).stdout == ""
    assert _run(tmp_path, repo, [push], "--allow-push") == 0  # the control: asked for, the push arrives
    _clean(capsys.readouterr().out)
    assert "pushed" in subprocess.run(branches, capture_output=True, text=True).stdout
    assert _run(tmp_path, repo, [{"run": "echo ${{ inputs.x }}"}], "--input", "x=$(touch pwned)") == 2
    assert "letters, digits" in capsys.readouterr().err and not (tmp_path / "pwned").exists()
