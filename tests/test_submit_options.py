"""The Slurm options of ``slurm-rl submit`` (--partition, --account, --qos, --time, --nodes,
--gpus-per-node, --constraint, --exclusive, --slurm KEY=VALUE) reach the sbatch script submitit writes.

Most tests put a stand-in ``sbatch`` on PATH that accepts the script and prints a job id: submitit
writes the script into RUN_DIR/logs/submitit as it would for a real submission, and the test reads
it back. The last test submits to the local Slurm test cluster (partition ``debug``) and waits for
the job.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from emulated_configs import emulated_config, write_config
from slurm_rl.cli import main
from slurm_rl.launch.submit import SlurmOptions, SubmitError, parse_slurm_time

REPO = Path(__file__).resolve().parents[1]
GROUP = REPO / "configs" / "examples" / "mux" / "group_2x8.yaml"


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``sbatch`` that accepts any script (a copy goes to the returned folder) and prints a job id."""
    bin_dir, seen = tmp_path / "bin", tmp_path / "sbatch-seen"
    bin_dir.mkdir()
    seen.mkdir()
    script = bin_dir / "sbatch"
    script.write_text(f'#!/bin/sh\ncp "$1" {seen}/\necho "Submitted batch job 4242"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return seen


def _sbatch_text(folder: Path, pattern: str = "*_submission.sh") -> str:
    """The one sbatch script in ``folder`` (submitit's: JOBID_submission.sh)."""
    scripts = sorted(folder.glob(pattern))
    assert len(scripts) == 1, list(folder.iterdir())
    return scripts[0].read_text()


def _sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


@pytest.mark.parametrize("text,minutes", [
    ("10", 10), ("90:30", 91), ("1:30:00", 90), ("2-0", 2880), ("2-12", 3600), ("2-12:30", 3630),
    ("2-12:30:00", 3630), ("0:30", 1), (45, 45),
])
def test_time_forms(text: str, minutes: int) -> None:
    assert parse_slurm_time(text) == minutes


@pytest.mark.parametrize("text", ["0", "abc", "1:2:3:4", "-5", "", "1-", "1.5", "infinite"])
def test_bad_time_is_refused(text: str) -> None:
    with pytest.raises(SubmitError, match="--time"):
        parse_slurm_time(text)


def test_options_map_to_submitit_parameters() -> None:
    opts = SlurmOptions.from_cli(partition="gpu", account="proj", qos="high", time="1:00:00", constraint="h100",
                                 exclusive=True, slurm=["mem=200G", "--mail-type=END", "reservation=rl", "requeue="])
    assert opts.params() == {
        "partition": "gpu", "account": "proj", "qos": "high", "time": 60, "constraint": "h100", "exclusive": True,
        "mem": "200G", "mail_type": "END", "additional_parameters": {"reservation": "rl", "requeue": True},
    }
    assert SlurmOptions().params() == {}


@pytest.mark.parametrize("item,message", [
    ("mem", "--slurm: got 'mem'; allowed: KEY=VALUE"),
    ("=5", "--slurm: got '=5'"),
    ("nodes=2", "use --nodes"),
    ("partition=x", "use --partition"),
    ("ntasks-per-node=3", "slurm_rl sets it"),
    ("setup=echo", "submitit setting"),
    ("a b=1", "an sbatch option name"),
])
def test_bad_slurm_items_are_refused(item: str, message: str) -> None:
    with pytest.raises(SubmitError, match=message.replace("(", r"\(")):
        SlurmOptions.from_cli(slurm=[item])


def test_partition_account_time_reach_the_sbatch_script(tmp_path: Path, fake_sbatch: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "c.yaml", emulated_config(run_dir, nodes=2, gpus_per_node=4))
    rc = main(["submit", str(config), "train.num_iterations=4", "--partition", "p", "--account", "a",
               "--time", "10", "--qos", "q", "--constraint", "h100|a100", "--exclusive",
               "--slurm", "mem=64G", "--slurm", "reservation=rl-week", "--slurm", "requeue="])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "submitted slurm job 4242 with 2 tasks for 8 ranks" in out.out  # a task per node forks its ranks
    text = _sbatch_text(run_dir / "logs" / "submitit")
    assert text == _sbatch_text(fake_sbatch, "*.sh")  # the script sbatch was given
    lines = _sbatch_lines(text)
    for line in ["#SBATCH --partition=p", "#SBATCH --account=a", "#SBATCH --time=10", "#SBATCH --qos=q",
                 "#SBATCH --constraint='h100|a100'", "#SBATCH --exclusive", "#SBATCH --mem=64G",
                 "#SBATCH --reservation=rl-week", "#SBATCH --requeue", "#SBATCH --nodes=2",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=4", "#SBATCH --signal=USR2@60",
                 "#SBATCH --job-name=slurm-rl"]:
        assert line in lines, (line, lines)
    assert not any("gres" in line for line in lines)  # an emulated run asks for no GPUs


def test_default_time_comes_from_the_config(tmp_path: Path, fake_sbatch: Path) -> None:
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "c.yaml", emulated_config(run_dir, run_timeout_s=1800.0))
    assert main(["submit", str(config)]) == 0
    lines = _sbatch_lines(_sbatch_text(run_dir / "logs" / "submitit"))
    # the run's 30 minutes, runtime.checkpoint_margin_s (2 minutes) for its final checkpoint, one minute rounding up
    assert "#SBATCH --time=33" in lines and not any("partition" in line for line in lines)


def test_gpus_per_node_fills_in_the_config(tmp_path: Path, fake_sbatch: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Like sbatch/train.sh's allocation: a config without cluster.gpus_per_node gets it from the option
    (not from the allocation the submitting shell may sit in)."""
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "2")
    run_dir = tmp_path / "run"
    cfg = emulated_config(run_dir, nodes=2, gpus_per_node=4)
    del cfg["cluster"]["gpus_per_node"]
    config = write_config(tmp_path / "c.yaml", cfg)
    assert main(["submit", str(config), "--nodes", "2", "--gpus-per-node", "4", "--time", "1-0"]) == 0
    assert "EMULATING" not in capsys.readouterr().err  # an emulated run asks for no GPUs: nothing to warn about
    lines = _sbatch_lines(_sbatch_text(run_dir / "logs" / "submitit"))
    assert {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=4",
            "#SBATCH --time=1440"} <= set(lines), lines
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["cluster"]["gpus_per_node"] == 4


@pytest.mark.parametrize("forkserver, tasks, per_node, cpus", [("1", 2, 1, 8), ("0", 8, 4, 2)])
def test_a_task_per_node_forks_its_ranks_with_their_cpus(tmp_path: Path, fake_sbatch: Path,
                                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                         forkserver: str, tasks: int, per_node: int, cpus: int) -> None:
    """A task per node by default (``--slurm cpus-per-task`` counts per rank: the task gets its 4 ranks'); a task
    per rank with ``SLURM_RL_FORKSERVER=0``."""
    monkeypatch.setenv("SLURM_RL_FORKSERVER", forkserver)
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "c.yaml", emulated_config(run_dir, nodes=2, gpus_per_node=4))
    assert main(["submit", str(config), "--slurm", "cpus-per-task=2"]) == 0
    assert f"with {tasks} tasks for 8 ranks" in capsys.readouterr().out
    lines = _sbatch_lines(_sbatch_text(run_dir / "logs" / "submitit"))
    assert {"#SBATCH --nodes=2", f"#SBATCH --ntasks-per-node={per_node}", f"#SBATCH --cpus-per-task={cpus}"} <= set(lines)


def test_a_config_without_gpus_per_node_names_the_option(tmp_path: Path, fake_sbatch: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    cfg = emulated_config(tmp_path / "never", nodes=2, gpus_per_node=4)
    del cfg["cluster"]["gpus_per_node"]
    assert main(["submit", str(write_config(tmp_path / "c.yaml", cfg)), "--nodes", "2"]) == 2
    assert "cluster.gpus_per_node: got None" in (err := capsys.readouterr().err) and "--gpus-per-node G" in err
    assert not (tmp_path / "never").exists()


def test_gpus_per_node_asks_for_gpus_on_auto_and_cuda(tmp_path: Path, fake_sbatch: Path) -> None:
    from slurm_rl.config import load_config
    from slurm_rl.launch.submit import make_executor

    cfg_doc = emulated_config(tmp_path / "never", nodes=2, gpus_per_node=4)
    for device, gpus_flag, gres in [("auto", 4, "gpu:4"), ("auto", None, None), ("cuda", None, "gpu:4"),
                                    ("cpu", 4, None)]:
        real = [] if device == "emulated" else [f"data.train_files=[{REPO / 'tests' / 'data' / 'add_4.jsonl'}]",
                                                 "reward.name=gsm8k"]
        cfg = load_config(write_config(tmp_path / f"{device}.yaml", cfg_doc), [f"runtime.device={device}", *real])
        opts = SlurmOptions(gpus_per_node=gpus_flag)
        ex = make_executor(cfg, tmp_path / f"dir-{device}-{gpus_flag}", "slurm", options=opts)
        lines = _sbatch_lines(ex._make_submission_file_text("true", "x"))  # the sbatch text, nothing submitted
        assert (f"#SBATCH --gres={gres}" in lines) if gres else not any("gres" in x for x in lines), (device, lines)


@pytest.mark.parametrize("args,message", [
    (["--nodes", "3"], "--nodes: got 3, but the config has cluster.num_nodes=2"),
    (["--gpus-per-node", "8"], "--gpus-per-node: got 8, but the config has cluster.gpus_per_node=4"),
    (["--slurm", "mem"], "--slurm: got 'mem'; allowed: KEY=VALUE"),
    (["--time", "soon"], "--time: got 'soon'"),
    (["--executor", "local", "--partition", "p"], "--partition: given with --executor local"),
])
def test_contradictions_and_bad_options_exit_2(tmp_path: Path, fake_sbatch: Path, args: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "c.yaml", emulated_config(run_dir, nodes=2, gpus_per_node=4))
    assert main(["submit", str(config), *args]) == 2
    assert message in capsys.readouterr().err
    assert not run_dir.exists() and not any(fake_sbatch.iterdir())  # nothing created, nothing submitted


def test_executor_choices_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["submit", "c.yaml", "--executor", "pbs"])
    assert exc.value.code == 2
    assert "invalid choice: 'pbs' (choose from slurm, local)" in capsys.readouterr().err.replace("'slurm', 'local'",
                                                                                                 "slurm, local")


def test_group_submit_takes_the_options(tmp_path: Path, fake_sbatch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    group_dir = tmp_path / "group"
    rc = main(["submit", "--group", str(GROUP), f"group.dir={group_dir}", "--partition", "p", "--account", "a",
               "--time", "1:30:00", "--gpus-per-node", "8", "--slurm", "mem=32G"])
    assert rc == 0, capsys.readouterr().err
    lines = _sbatch_lines(_sbatch_text(group_dir / "logs" / "submitit"))
    for line in ["#SBATCH --partition=p", "#SBATCH --account=a", "#SBATCH --time=90", "#SBATCH --mem=32G",
                 "#SBATCH --nodes=1", "#SBATCH --job-name=slurm-rl-mux"]:
        assert line in lines, (line, lines)
    never = tmp_path / "never"
    assert main(["submit", "--group", str(GROUP), f"group.dir={never}", "--nodes", "2"]) == 2
    assert "--nodes: got 2; allowed: 1 with --group" in capsys.readouterr().err
    assert main(["submit", "--group", str(GROUP), f"group.dir={never}", "--gpus-per-node", "4"]) == 2
    assert "group.gpus_per_node=8" in capsys.readouterr().err
    assert not never.exists()


@pytest.mark.slow
@pytest.mark.slurm
def test_options_on_real_slurm(slurm_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """submit --partition debug --account root --time 10 on the local cluster: the job runs there,
    with the partition, account and time limit it was given."""
    import submitit

    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    run_dir = tmp_path / "run"
    cfg = emulated_config(run_dir, nodes=2, gpus_per_node=4)
    del cfg["cluster"]["gpus_per_node"]  # from --gpus-per-node, as from an allocation
    config = write_config(tmp_path / "c.yaml", cfg)
    rc = main(["submit", str(config), "--partition", "debug", "--account", "root", "--time", "10",
               "--nodes", "2", "--gpus-per-node", "4", "--slurm", "comment=slurm-rl-options-test"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    job_id = out.out.split("submitted slurm job ")[1].split()[0]
    job = submitit.SlurmJob(folder=run_dir / "logs" / "submitit", job_id=job_id, tasks=(0, 1))
    assert job.results() == [0] * 2  # a task per node
    lines = _sbatch_lines(_sbatch_text(run_dir / "logs" / "submitit"))
    assert {"#SBATCH --partition=debug", "#SBATCH --account=root", "#SBATCH --time=10",
            "#SBATCH --comment=slurm-rl-options-test"} <= set(lines), lines
    shown = slurm_cluster.run("scontrol", "show", "job", job_id).stdout
    for field in ("Partition=debug", "Account=root", "TimeLimit=00:10:00", "NumNodes=2", "Comment=slurm-rl-options-test"):
        assert field in shown, (field, shown)
