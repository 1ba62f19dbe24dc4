"""What a newcomer meets first on the command line: ``slurm-rl --version``, plain-text ``--help`` that
lists every command, every option's help with its default, and ``validate`` of group files."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from slurm_rl.cli import COMMANDS, MUX_VERBS, _Formatter, _mux_verbs, _parser, main

REPO = Path(__file__).resolve().parents[1]
MUX = REPO / "configs" / "examples" / "mux"
GROUPS = sorted(MUX.glob("group_*.yaml"))


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"slurm-rl {version('slurm_rl')}"
    proc = subprocess.run([sys.executable, "-m", "slurm_rl.cli", "--version"], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.strip() == f"slurm-rl {version('slurm_rl')}"


def test_top_level_help_is_plain_text_and_lists_every_command() -> None:
    text = _parser().format_help()
    for markup in ("``", ":func:", ":class:", ":mod:", ":meth:", ".. "):
        assert markup not in text, (markup, text)
    assert text.splitlines()[2].startswith("slurm-rl: RL post-training")
    for name in COMMANDS:
        lines = [line for line in text.splitlines() if re.match(rf"^\s+{name}\s+\S", line)]
        assert len(lines) == 1, (name, text)  # the command with its one-line description
    assert set(_subparsers()) == set(COMMANDS)
    assert "exit codes: 0 done; 2 bad config or arguments" in text


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_has_help_and_shows_its_default(command: str) -> None:
    _check_options(command, _subparsers()[command])


@pytest.mark.parametrize("verb", sorted(MUX_VERBS))
def test_every_mux_verb_option_has_help_and_shows_its_default(verb: str) -> None:
    """``slurm-rl mux add|remove|place`` (parsed apart from ``mux GROUP.yaml``)."""
    parser, _ = _mux_verbs()[verb]
    assert parser.prog == f"slurm-rl mux {verb}"
    _check_options(f"mux {verb}", parser)


def _check_options(command: str, parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()  # raises on a stray '%' in a help string (argparse formats help with %)
    assert "%(" not in text
    formatter = _Formatter(prog=parser.prog)
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        assert action.help, (command, action.option_strings)
        shown = formatter._get_help_string(action) % {"default": action.default}
        assert ("required" if action.required else "default") in shown, (command, action.option_strings, shown)
        assert "(default: None)" not in shown, (command, action.option_strings, shown)  # says what None means
    for action in parser._actions:
        if not action.option_strings:
            assert action.help, (command, action.dest)  # positionals have help too


def test_submit_help_shows_executor_choices_and_slurm_options() -> None:
    text = " ".join(_subparsers()["submit"].format_help().split())
    assert "--executor {slurm,local}" in text and "(default: slurm)" in text
    for flag in ("--partition", "--account", "--qos", "--time", "--nodes", "--gpus-per-node", "--constraint",
                 "--exclusive", "--slurm KEY=VALUE"):
        assert flag in text, flag


@pytest.mark.parametrize("group", GROUPS, ids=lambda p: p.name)
def test_validate_each_example_group(group: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    group_dir = tmp_path / "never"
    assert main(["validate", str(group), f"group.dir={group_dir}"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"group {group}: valid; ")
    assert "rollout pool slots 0-3, train pool slots 4-7" in text and "residency:" in text
    assert main(["validate", str(group), f"group.dir={group_dir}", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["pools"] == {"rollout": [0, 1, 2, 3], "train": [4, 5, 6, 7]}
    assert set(doc["jobs"]) == set(doc["members"]) and len(doc["members"]) >= 2
    assert doc["admission"]["slo_checked"] is True and "predicted_slowdown" in doc["admission"]
    assert not group_dir.exists()  # validate creates nothing


def test_validate_the_example_job_configs(capsys: pytest.CaptureFixture[str]) -> None:
    for config in sorted(MUX.glob("job_*.yaml")):
        assert main(["validate", str(config)]) == 0
        assert capsys.readouterr().out.startswith(f"config {config}: valid; world size ")


def test_validate_a_broken_group_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "group.yaml"
    text = GROUPS[0].read_text().replace("train: 4-7", "train: 3-7").replace("tail_slots: 1 ", "tail_slot: 1 ")
    broken.write_text(text.replace("config: job_", f"config: {MUX}/job_"))
    assert main(["validate", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "group.pools.train: got '3-7'; allowed: slots disjoint from group.pools.rollout" in err
    assert "group.tail_slot: got 1; allowed: a known key" in err
    (tmp_path / "nojobs.yaml").write_text("group:\n  pools: {rollout: 0-3, train: 4-7}\n")
    assert main(["validate", str(tmp_path / "nojobs.yaml"), "--json"]) == 2
    assert "jobs: got None" in capsys.readouterr().err
    # a group member's own config error names the job's key
    assert main(["validate", str(GROUPS[0]), "jobs.reasoning.overrides=[train.num_iterations=0]"]) == 2
    assert "train.num_iterations" in capsys.readouterr().err
