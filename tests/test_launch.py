"""Launchers of `attnid experiments` (submitit): local processes, the debug executor, and a SLURM array."""

import json
import os
import stat

import pytest

from attnid.lm.launch import SlurmOptions, launch, make_executor
from attnid.lm.profiles import make_config
from attnid.lm.records import is_finished, load_run, run_dir


def _configs(cases=("sgd", "adamw")):
    return [make_config("smoke", c, max_iters=6, eval_interval=3, ckpt_interval=3, metric_interval=2) for c in cases]


@pytest.mark.parametrize("launcher", ["debug", pytest.param("local", marks=pytest.mark.slow)])
def test_every_run_is_a_job_that_writes_its_own_record(launcher, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "runs"))  # the local jobs inherit the environment
    lines = []
    threads = 1 if launcher == "local" else None  # a local job runs with the threads it is given
    summaries = launch(_configs(), launcher, folder=tmp_path / "logs", parallel=2, report=lines.append, threads=threads)
    assert [s["case"] for s in summaries] == ["sgd", "adamw"]
    for cfg, s in zip(_configs(), summaries):
        d = run_dir("smoke", cfg.case, 0, tmp_path / "runs")
        assert is_finished(d)
        rec = load_run("smoke", cfg.case, base=tmp_path / "runs")
        assert rec.summary["final_val_loss"] == pytest.approx(s["final_val_loss"])
        assert rec.rows[-1]["step"] == 6
    assert len(lines) == 2 and all("final val loss" in line for line in lines)
    if launcher == "local":  # one submitit job folder (logs, pickles) per run
        assert len(list((tmp_path / "logs").glob("*_log.out"))) == 2
        assert {s["threads"] for s in summaries} == {1}


def test_a_second_launch_reuses_the_records(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path / "runs"))
    first = launch(_configs(("sgd",)), "debug", folder=tmp_path / "logs", report=lambda _: None)
    again = launch(_configs(("sgd",)), "debug", folder=tmp_path / "logs", report=lambda _: None)
    assert again[0]["wall_seconds"] == first[0]["wall_seconds"]  # read back, not retrained


def _fake_slurm(tmp_path, monkeypatch):
    """`srun` and `sbatch` stand-ins: sbatch keeps the script it is given and answers with a job id."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {tmp_path}/submitted.sh\necho "Submitted batch job 4242"\n')
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_slurm_submits_one_array_with_the_users_options(tmp_path, monkeypatch):
    _fake_slurm(tmp_path, monkeypatch)
    opts = SlurmOptions(partition="gpu", time_min=45, gpus_per_job=2, cpus_per_job=4, array_parallelism=1)
    jobs = launch(_configs(), "slurm", folder=tmp_path / "logs", slurm=opts, report=lambda _: None)
    assert [j.job_id for j in jobs] == ["4242_0", "4242_1"]
    script = (tmp_path / "submitted.sh").read_text()
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --time=45",
        "#SBATCH --gpus-per-node=2",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --array=0-1%1",
    ):
        assert line in script, line
    # each job carries its own run config, to be trained and recorded on its node
    pickles = sorted((tmp_path / "logs").glob("*_submitted.pkl"))
    assert len(pickles) == 2


def test_launcher_errors_are_one_line(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="launcher: expected one of"):
        launch(_configs(), "kubernetes")
    with pytest.raises(ValueError, match="parallel must be a positive integer"):
        launch(_configs(), "local", parallel=0)
    with pytest.raises(ValueError, match="time_min must be a positive integer"):
        SlurmOptions(time_min=0)
    monkeypatch.setenv("PATH", str(tmp_path))  # no SLURM here
    with pytest.raises(ValueError, match="slurm needs the SLURM commands"):
        make_executor("slurm", tmp_path)


def test_the_cli_submits_a_suite_to_slurm(tmp_path, monkeypatch, capsys):
    from attnid.cli import main

    _fake_slurm(tmp_path, monkeypatch)
    rc = main(
        [
            "experiments",
            "--profile",
            "smoke",
            "--suite",
            "heads",
            "--launcher",
            "slurm",
            "--partition",
            "a100",
            "--time",
            "30",
            "--log-dir",
            str(tmp_path / "logs"),
            "--device",
            "cuda",
        ]
    )
    assert rc == 0
    assert "submitted 6 runs as SLURM array 4242" in capsys.readouterr().out
    assert "#SBATCH --partition=a100" in (tmp_path / "submitted.sh").read_text()


def test_a_local_job_killed_is_named_and_resumable(tmp_path, monkeypatch):
    """A job that dies (kill -9: submitit's UncompletedJobError) is reported with the runs that did not
    finish, in one error that says rerunning resumes them; the other runs' results still come back."""
    from submitit.core.utils import UncompletedJobError

    from attnid.lm import launch as launch_mod

    class Job:
        def __init__(self, config):
            self.config = config

        def result(self):
            if self.config["case"] == "adamw":
                raise UncompletedJobError("the job was killed")
            return {"final_val_loss": 2.0, "wall_seconds": 1.0, "precision": "fp32"}

    class Executor:
        def submit(self, fn, config, force, threads):
            return Job(config)

    monkeypatch.setattr(launch_mod, "make_executor", lambda *a, **k: Executor())
    lines = []
    with pytest.raises(launch_mod.LaunchError, match=r"1 of 2 runs did not finish .adamw seed 0") as e:
        launch(_configs(), "local", folder=tmp_path / "logs", report=lines.append)
    assert "run the same command again" in str(e.value)
    assert any("sgd" in line and "final val loss" in line for line in lines)
    assert any("adamw" in line and "did not finish" in line for line in lines)


def test_log_dir_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(ValueError, match="not a folder"):
        make_executor("local", f)


def test_a_local_job_has_no_short_deadline(tmp_path):
    """submitit's local executor kills a job at its deadline, 2 minutes by default, and hands the deadline to the
    job as SUBMITIT_LOCAL_TIMEOUT_S: the job itself reads what it was given (no need to wait 2 minutes)."""
    from attnid.lm.launch import LOCAL_TIMEOUT_MIN

    ex = make_executor("local", tmp_path / "logs")
    deadline_s = int(ex.submit(os.getenv, "SUBMITIT_LOCAL_TIMEOUT_S").result())
    assert deadline_s == 60 * LOCAL_TIMEOUT_MIN >= 7 * 24 * 3600


def test_a_killed_jobs_reason_is_submitits_not_a_row_of_dashes():
    """submitit quotes the job's log between rows of dashes: the reason kept is its own line."""
    from submitit.core.utils import UncompletedJobError

    from attnid.lm.launch import job_failure

    e = UncompletedJobError(
        "Job 4242 (task: 0) with path /runs/.submitit/4242_0_result.pkl\n"
        "has not produced any output (state: FINISHED)\nError stream produced:\n" + "-" * 40 + "\n" + "-" * 40 + "\n"
    )
    assert job_failure(e) == "UncompletedJobError: has not produced any output (state: FINISHED)"
    e = UncompletedJobError("has not produced any output (state: FINISHED)\n" + "-" * 40 + "\nKilled\n")
    assert job_failure(e).endswith("; its log ends: Killed")


def _job_processes(marker: str) -> list[int]:
    """Pids of live processes whose command line or environment names ``marker`` (the test's runs folder)."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{p}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if marker.encode() in cmd or marker.encode() in env:
            pids.append(int(p))
    return pids


@pytest.mark.slow
def test_sigterm_stops_a_local_suite_and_its_jobs(corpus, tmp_path):
    """SIGTERM to `experiments --launcher local --parallel 2`, started as in the background: its jobs are stopped
    and waited for, it says so in one line and exits 143, and nothing is left running to write records after it."""
    import signal
    import subprocess
    import sys
    import time

    runs = tmp_path / "runs"
    env = {**os.environ, "ATTNID_RUNS": str(runs)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnid", "experiments", "--profile", "cpu", "--launcher", "local", "--parallel", "2",
         "--seed", "0", "--threads", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # as a command started in the background (`cmd &`): SIGINT ignored, and its jobs inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while len(list(runs.glob("cpu/*/config.json"))) < 2:  # both jobs are training
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert lines[-1].startswith("attnid: stopped by SIGTERM: the running jobs (") and "Traceback" not in err
    assert not _job_processes(str(runs))  # no job outlives the command
    assert not list(runs.glob("cpu/*/summary.json"))  # and none finished after the stop


def test_a_job_that_ignores_the_stop_is_killed_with_its_run(monkeypatch):
    """A run that does not end on SIGINT within STOP_WAIT_S is killed, and the run with its controller: nothing
    is left to write records after the command (an orphaned run would go on training)."""
    import signal
    import subprocess
    import sys
    import time

    from attnid.lm import launch

    # the run: ignores SIGINT, says so, then trains until its input closes (here: until it is killed)
    code = "import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); print(flush=True); sys.stdin.read()"
    controller = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {code!r}])"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )

    class Job:
        _process = controller

        def done(self) -> bool:
            return controller.poll() is not None

    assert controller.stdout is not None
    controller.stdout.readline()  # the run ignores SIGINT from here on
    (run,) = launch._descendants(controller.pid)
    deadline = time.monotonic() + 60
    monkeypatch.setattr(launch, "STOP_WAIT_S", 0.5)
    assert launch.stop_jobs([Job()])
    assert controller.poll() == -signal.SIGKILL
    try:
        while _running(run):  # an event: the run's end, polled against a deadline
            assert time.monotonic() < deadline, "the run outlived its controller"
            time.sleep(0.05)
    finally:
        assert controller.stdin is not None
        controller.stdin.close()  # a run that survived ends here


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux's /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_workers_train_every_run_once_and_name_the_one_that_fails(corpus, tmp_path, monkeypatch):
    """The book's runs train in worker processes that take one run after another: each run is trained once (its
    record finished) and reported once, the summaries come back in the order given, and a run that fails (planted:
    its folder holds a run of another config) is named in one line while the others finish; then LaunchError names
    it."""
    from attnid.lm import records
    from attnid.lm.launch import LaunchError
    from attnid.lm.workers import train_in_workers

    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path))
    cfgs = [make_config("smoke", case, seed=0) for case in ("points_sgd", "points_adamw", "points_sgd_wd")]
    lines: list[str] = []
    out = train_in_workers(cfgs[:2], 2, report=lines.append)
    assert [s["case"] for s in out] == ["points_sgd", "points_adamw"] and len(lines) == 2
    assert all(records.is_finished(records.run_dir("smoke", c.case, 0)) for c in cfgs[:2])
    planted = records.run_dir("smoke", "points_sgd_wd", 0)
    planted.mkdir(parents=True)
    (planted / "config.json").write_text(json.dumps(make_config("smoke", "points_sgd_wd", seed=0, lr=0.25).as_dict()))
    lines.clear()
    again = [make_config("smoke", "points_sgd", seed=1), cfgs[2], make_config("smoke", "points_adamw", seed=1)]
    with pytest.raises(LaunchError, match=r"^1 of 3 runs did not finish \(points_sgd_wd seed 0\); run the same"):
        train_in_workers(again, 2, report=lines.append)
    assert sorted(line.split(":")[0] for line in lines) == ["[1/3] smoke/points_sgd seed 1",
                                                            "[2/3] smoke/points_sgd_wd seed 0",
                                                            "[3/3] smoke/points_adamw seed 1"]  # fmt: skip
    failed = next(line for line in lines if "points_sgd_wd" in line)
    assert "did not finish (" in failed and "another config" in failed, failed
    assert records.is_finished(records.run_dir("smoke", "points_adamw", 1))


def test_suites_train_in_the_order_given_each_longest_first(tmp_path, monkeypatch):
    """``train_suites`` is one launch: the suites in the order the chapters need them (a chapter waiting for the
    first ones executes while the last ones train), the longest runs of each suite first."""
    import attnid.lm.launch as launch_mod
    from attnid.lm.launch import relative_cost, train_suites
    from attnid.lm.profiles import suite_of

    monkeypatch.setenv("ATTNID_RUNS", str(tmp_path))
    launches: list[list] = []
    monkeypatch.setattr(launch_mod, "train_configs", lambda cfgs, device, report: launches.append(cfgs) or len(cfgs))
    assert train_suites("cpu", ["dynamics", "points", "heads", "points"], "cpu") == 24 + 4 + 12
    (cfgs,) = launches
    suites = [suite_of(c.case) for c in cfgs]
    assert list(dict.fromkeys(suites)) == ["dynamics", "points", "heads"]
    assert suites == sorted(suites, key=["dynamics", "points", "heads"].index)  # each suite's runs together
    for name in ("dynamics", "heads"):  # the points runs all cost the same
        costs = [relative_cost(c) for c, s in zip(cfgs, suites) if s == name]
        assert costs == sorted(costs, reverse=True) and len(set(costs)) > 1
