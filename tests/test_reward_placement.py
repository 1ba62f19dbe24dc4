"""A reward placed apart from the rollout (RLinf's ``reward`` component on ranks of its own choosing, e.g.
``inference,reward: 3`` or ``actor,reward: 0-1``): the rollout writes its responses unscored, the reward's ranks
score every one in their worker processes into the rewards stage, and inference and the actor read that. The
run, also stopped and resumed, trains as the reference, whose rollout ranks score beside their engine: the same prompts, rewards and, on
cpu, per-step losses and final weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from resume_helpers import BACKENDS, assert_same_outcome, cli, run_config, run_until_stopped
from emulated_configs import write_config
from slurm_rl.data.reader import StageReader


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("placement", "reward_ranks", "stop_at"), [
    ({"actor": "0-1", "rollout": "2", "inference,reward": "3"}, [3], None),  # scored beside the inference
    # two ranks, each its share of the shards; stopped at the gate of iteration 2 and resumed
    ({"actor,reward": "0-1", "rollout": "2", "inference": "3"}, [0, 1], 2),
], ids=["with-inference", "with-actor-resumed"])
def test_a_reward_apart_from_the_rollout_scores_on_its_ranks(backend: str, placement: dict, reward_ranks: list[int],
                                                             stop_at: int | None, reference, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = run_config(backend, run_dir, reward_workers=2, keep_iterations=10)
    cfg["cluster"]["component_placement"] = placement
    config = write_config(tmp_path / "c.yaml", cfg)
    validate = cli("validate", str(config))
    assert validate.returncode == 0, validate.stdout + validate.stderr
    shown = f"{reward_ranks[0]}-{reward_ranks[-1]}" if len(reward_ranks) > 1 else str(reward_ranks[0])
    assert f"reward     ranks {shown:<12} apart from the rollout" in validate.stdout, validate.stdout
    if stop_at is None:
        proc = cli("run", str(config), "--no-inspect")
    else:
        run_until_stopped(config, run_dir, at_iteration=stop_at)
        proc = cli("run", "--resume", str(run_dir), "--no-inspect")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_same_outcome(run_dir, reference(backend))
    samples = cfg["train"]["rollout_batch_size"] * cfg["train"]["group_size"]
    for k in range(4):
        rollouts = StageReader(run_dir, k, "rollouts", None, timeout_s=5).read_all()
        assert all(math.isnan(r) for r in rollouts.column("reward").to_pylist())  # the rollout scored none
        rewarded = StageReader(run_dir, k, "rewards", None, timeout_s=5).read_all()
        assert sorted(rewarded.column("sample_id").to_pylist()) == sorted(rollouts.column("sample_id").to_pylist())
        assert rewarded.num_rows == samples and not any(math.isnan(r) for r in rewarded.column("reward").to_pylist())
        stage = run_dir / "data" / f"iter-{k:06d}" / "rewards"
        assert sorted(int(m.stem.split("-")[1]) for m in stage.glob("manifest-*.json")) == reward_ranks


def test_a_reward_on_slots_no_component_uses_is_refused(tmp_path: Path) -> None:
    """The reward's worker processes run beside a rank: a reward entry on a slot that serves no component exits 2
    naming the entry and the slot, before anything is launched."""
    cfg = run_config("emulated", tmp_path / "run")
    cfg["cluster"]["component_placement"] = {"actor": "0-1", "rollout": "2", "reward": "3"}
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cluster.component_placement.reward: got '3'; allowed: slots of ranks that serve a component (the " \
           "reward's worker processes run beside a rank: slots [3] serve none)" in proc.stderr
    assert not (tmp_path / "run").exists()
