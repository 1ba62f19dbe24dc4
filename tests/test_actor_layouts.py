"""Every change between actor layouts (TP in {1, 2, 4} x DP in {1, 2, 4}, TP x DP <= 4, and a TP
group that moves) on 4 gloo ranks, with optimizer state, equals saving the full state and loading
it at the new layout -- bitwise; with ZeRO-1 and in bf16 (fp32 master) too. The walk trains one step
at every layout it reaches, so the moments and the step counter are live state."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import torch

from slurm_rl.engines.actor.layout import Layout, ParamSpec, param_specs
from slurm_rl.engines.actor.layout_reshard import pieces_bytes, plan_layout_change
from slurm_rl.engines.actor.local_dist import run_local
from slurm_rl.engines.model_config import ModelConfig

MODEL = ModelConfig(vocab_size=64, hidden_size=128, num_layers=1, num_attention_heads=4,
                    num_query_groups=4, ffn_hidden_size=128, qkv_bias=True)
LAYOUTS = [Layout((0,), 1), Layout((0, 1), 1), Layout((0, 1, 2, 3), 1), Layout((0, 1), 2),
           Layout((0, 1, 2, 3), 2), Layout((0, 1, 2, 3), 4), Layout((2, 3), 2)]


def euler_walk(n: int) -> list[int]:
    """A closed walk over the complete directed graph on ``n`` nodes using every edge once."""
    out = {v: [u for u in range(n) if u != v] for v in range(n)}
    stack, walk = [0], []
    while stack:
        v = stack[-1]
        if out[v]:
            stack.append(out[v].pop())
        else:
            walk.append(stack.pop())
    return walk[::-1]


def _samples() -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(4):
        ids = torch.randint(0, MODEL.vocab_size, (8 + i,), generator=g).tolist()
        out.append({"input_ids": ids, "loss_mask": [1.0] * (len(ids) - 1)})
    return out


def _full_state(trainer: Any, root: str, tag: str) -> dict[str, torch.Tensor]:
    """The trainer's full state as every rank sees it after a save by the actor's first rank."""
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file

    path = f"{root}/{tag}.safetensors"
    if trainer.active:
        state = trainer.state_dict()
        if state is not None:
            flat = {f"model/{k}": v for k, v in state["model"].items()}
            flat.update({f"optimizer/{k}": v for k, v in state["optimizer"].items()})
            flat["step"] = torch.tensor([state["meta"]["step"]])
            save_file({k: v.contiguous() for k, v in flat.items()}, path)
    dist.barrier()
    return load_file(path)


def _check_local(trainer: Any, full: dict[str, torch.Tensor]) -> list[str]:
    """Names whose local master / moments differ bitwise from the full state's shard."""
    specs: dict[str, ParamSpec] = {s.name: s for s in trainer.specs}
    master, m, v = trainer._local_arrays()
    bad = []
    tp, r = trainer.tp, trainer.tp_rank
    for array, prefix in ((master, "model/"), (m, "optimizer/exp_avg/"), (v, "optimizer/exp_avg_sq/")):
        for name, view in trainer.flat.named_views(array):
            if not torch.equal(view, specs[name].shard(full[prefix + name], tp, r)):
                bad.append(prefix + name)
    if trainer.flat.mixed and not torch.equal(trainer.flat.compute, master.to(trainer.flat.compute.dtype)):
        bad.append("compute copy")
    if trainer.step != int(full["step"][0]):
        bad.append(f"step {trainer.step} != {int(full['step'][0])}")
    if not trainer.flat.mixed:  # the sharded model computes what the TP 1 model of the full state does
        gap = _logprob_gap(trainer, full)
        if gap > 1e-5:
            bad.append(f"logprobs differ from TP 1 by {gap:.2e}")
    return bad


def _logprob_gap(trainer: Any, full: dict[str, torch.Tensor]) -> float:
    from slurm_rl.engines.actor.model import build_gpt_model, token_logprobs

    ref = build_gpt_model(MODEL, seed=0, initialize=False)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(full["model/" + name])
        ids = torch.tensor([s["input_ids"][:8] for s in _samples()])
        return float((token_logprobs(trainer.model, ids) - token_logprobs(ref, ids)).abs().max())


VARIANTS = [(False, "fp32"), (True, "fp32"), (False, "bf16"), (True, "bf16")]  # (zero1, precision)


def walk_worker(rank: int, world: int, root: str) -> dict[str, Any]:
    """Every variant's walk in one gloo world (one start of the 4 processes)."""
    return {f"{precision}{'-zero1' if zero1 else ''}": _walk(rank, root, zero1, precision)
            for zero1, precision in VARIANTS}


def _walk(rank: int, root: str, zero1: bool, precision: str) -> dict[str, Any]:
    from slurm_rl.engines.actor.groups import GroupCache
    from slurm_rl.engines.actor.microbatch import BatchConfig
    from slurm_rl.engines.actor.optimizer import OptimConfig
    from slurm_rl.engines.actor.trainer import ActorTrainer

    start = LAYOUTS[0]
    trainer = ActorTrainer(MODEL, OptimConfig(lr=1e-2, zero1=zero1), BatchConfig(4, 1), start.ranks,
                           GroupCache(timeout=120), seed=7, tp=start.tp, precision=precision)
    samples = _samples()
    failures, steps, moved = [], 0, 0.0
    walk = euler_walk(len(LAYOUTS))
    for i, (a, b) in enumerate(zip(walk, walk[1:])):
        old, new = LAYOUTS[a], LAYOUTS[b]
        if rank in old:
            share = len(samples) // old.dp
            d = old.dp_rank(rank)
            stats = trainer.train_step(samples[d * share:(d + 1) * share])
            assert torch.isfinite(torch.tensor(stats["loss"]))
            steps += 1
        full = _full_state(trainer, root, f"{precision}-{zero1}-{i}")
        if rank in set(old.ranks) | set(new.ranks):
            figures = trainer.reshard(new.ranks, epoch=i, old_ranks=old.ranks, new_tp=new.tp, old_tp=old.tp)
            moved += figures["bytes_received"]
        if rank in new:
            failures += [f"{old.describe()} -> {new.describe()}: {x}" for x in _check_local(trainer, full)]
    if trainer.active:
        trainer.free(keep_warm=False)
    return {"failures": failures, "transitions": len(walk) - 1, "steps": steps, "received": moved}


@pytest.mark.slow
def test_every_layout_change_equals_a_full_save_and_load() -> None:
    """fp32, fp32 with ZeRO-1, bf16 (fp32 master) and bf16 with ZeRO-1 (the fp32 master sharded
    too): 42 changes each."""
    with tempfile.TemporaryDirectory() as root:
        out = run_local(walk_worker, 4, args=(root,), timeout_s=900)
    for variant in out[0]:
        assert out[0][variant]["transitions"] == len(LAYOUTS) * (len(LAYOUTS) - 1)
        for r, o in enumerate(out):
            assert o[variant]["failures"] == [], (variant, r, o[variant]["failures"][:10])
        assert sum(o[variant]["received"] for o in out) > 0, variant


def test_plan_moves_only_what_changes_hands() -> None:
    """TP 2 x DP 1 -> TP 2 x DP 2 sends each joiner one replica of the state; TP 2 -> 1 on the
    same ranks sends each rank the other half; an unchanged TP group receives nothing."""
    specs = param_specs([("embedding.word_embeddings.weight", (32, 16)),
                         ("decoder.layers.0.mlp.linear_fc1.weight", (32, 16)),
                         ("decoder.layers.0.input_layernorm.weight", (16,))], 2)
    full = sum(s.numel for s in specs)
    local = sum(s.local_numel(2) for s in specs)
    grow = plan_layout_change(Layout((0, 1), 2), Layout((0, 1, 2, 3), 2), specs)
    assert {p.dst for p in grow} == {2, 3}
    assert pieces_bytes(grow, specs) == 2 * local * 3 * 4
    merge = plan_layout_change(Layout((0, 1), 2), Layout((0, 1), 1), specs)
    replicated = specs[2].numel
    assert pieces_bytes(merge, specs) == 2 * (full - local) * 3 * 4  # the other TP half, not the norm
    assert all(p.param != 2 for p in merge) and replicated == 16
    assert plan_layout_change(Layout((0, 1), 2), Layout((0, 1), 2), specs) == []


def test_fc1_shard_holds_its_slice_of_gate_and_up() -> None:
    spec = param_specs([("decoder.layers.0.mlp.linear_fc1.weight", (4, 3))], 2)[0]
    full = torch.arange(8 * 3).reshape(8, 3)  # rows 0-3 gate, 4-7 up
    assert spec.shard(full, 2, 0)[:, 0].tolist() == [0, 3, 12, 15]
    assert torch.equal(spec.unshard([spec.shard(full, 2, r) for r in range(2)]), full)


def _grads(recompute: str) -> dict[str, torch.Tensor]:
    from slurm_rl.engines.actor.model import build_gpt_model, token_logprobs

    model = build_gpt_model(MODEL, seed=1, recompute=recompute)
    ids = torch.tensor([s["input_ids"][:8] for s in _samples()])
    token_logprobs(model, ids).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_recompute_gives_the_same_gradients() -> None:
    """Selective and full activation recompute (megatron-core's) change memory, not gradients."""
    from slurm_rl.engines.actor.model import init_local_process_group

    init_local_process_group()
    ref = _grads("none")
    for mode in ("selective", "full"):
        got = _grads(mode)
        assert got.keys() == ref.keys()
        for name, g in ref.items():
            assert torch.allclose(got[name], g, rtol=0, atol=1e-6 * float(g.abs().max())), (mode, name)
