"""The README fits its first screen and every command in it runs; the docs it links exist and their generated
parts (config reference, verl's and RLinf's key tables) say what the code does."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_LINES = 150


def _bash_blocks(text: str) -> list[list[str]]:
    """The commands of each ```bash block (comment lines left out)."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    return [[line.strip() for line in b.splitlines() if line.strip() and not line.strip().startswith("#")]
            for b in blocks]


def test_readme_first_screen() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES, len(lines)
    assert lines[0].startswith("# slurm_rl: ")
    what = lines[2:lines.index("## Quick start")]
    assert len([line for line in what if line.strip()]) == 3  # what it is, in 3 lines
    quick = _bash_blocks(text.split("## Quick start", 1)[1])[0]
    assert quick == ["bash tools/quickstart.sh", "bash tools/test.sh"]
    assert "What the quickstart shows" in text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    # CI runs the second command: the whole suite on a fresh clone
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "bash tools/test.sh"


def test_links_of_readme_and_docs_exist() -> None:
    for page in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links {target}"
    for name in ("getting-started-cluster", "config-reference", "coming-from-verl", "coming-from-rlinf",
                 "scheduling", "benchmarks", "testing"):
        assert f"docs/{name}.md" in README.read_text()


def test_generated_docs_are_up_to_date() -> None:
    """What ``python tools/gen_docs.py`` writes is what the files hold."""
    from slurm_rl.config_docs import config_reference, dialect_table, splice

    for name, part in (("config-reference", config_reference()), ("coming-from-verl", dialect_table("verl")),
                       ("coming-from-rlinf", dialect_table("rlinf"))):
        text = (REPO / "docs" / f"{name}.md").read_text()
        assert splice(text, part) == text, f"docs/{name}.md is out of date: python tools/gen_docs.py"
    reference = (REPO / "docs" / "config-reference.md").read_text()
    for key in ("`train.global_batch_size`", "`runtime.logger`", "`actor.offload_weight`", "`rollout.backend`"):
        assert key in reference
    assert "| `actor_rollout_ref.actor.ppo_mini_batch_size` | `train.global_batch_size` (from several keys)" in (
        REPO / "docs" / "coming-from-verl.md").read_text()


@pytest.fixture()
def clone(tmp_path: Path) -> Path:
    """A directory that looks like the repository (its files linked), so the README's commands run there as
    written and leave their runs/ in it."""
    for name in ("configs", "tools", "sbatch", "slurm_rl", "pyproject.toml", ".venv"):
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


@pytest.mark.slow
def test_every_readme_command_runs(clone: Path) -> None:
    """Each command of the README's bash blocks exits 0, as written, from the repository root. The quickstart
    runs 2 of its 300 iterations (it passes arguments to slurm-rl run); `bash tools/test.sh` is the whole
    suite, which CI runs (above)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    ran = []
    for block in _bash_blocks(README.read_text()):
        for command in block:
            if command == "bash tools/test.sh":
                continue
            args = shlex.split(command)
            if command == "bash tools/quickstart.sh":
                args += ["train.num_iterations=2", "--no-inspect"]
            proc = subprocess.run(args, cwd=clone, capture_output=True, text=True, timeout=600, env=env)
            assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            ran.append(command)
    assert "bash tools/quickstart.sh" in ran and len(ran) >= 3
    assert len(list((clone / "runs").glob("quickstart-*"))) == 1  # the quickstart's run
