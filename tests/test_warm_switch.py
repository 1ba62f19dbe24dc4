"""Warm switching: engines park their state in host memory and resume in place, unchanged.

The actor (megatron-core, one-rank gloo world in this process), the hf rollout engine and the
reference scorer free their storage in place while parked (0 bytes, same tensor objects) and
continue exactly as if they had never been parked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from slurm_rl.engines.actor.groups import GroupCache
from slurm_rl.engines.actor.trainer import ActorTrainer
from slurm_rl.engines.parking import HostParking, ParkedError
from slurm_rl.engines.rollout import SamplingParams
from slurm_rl.engines.rollout.hf import HFRolloutEngine, build_hf_model
from test_actor_reshard import BATCH, MODEL, OPTIM, make_batch
from test_rollout_hf import CFG, PROMPTS

STEPS = 4


@pytest.fixture(scope="module", autouse=True)
def world() -> None:
    from slurm_rl.engines.actor.model import init_local_process_group

    torch.set_num_threads(1)
    init_local_process_group()


def _trainer(zero1: bool, attention: str = "sdpa") -> ActorTrainer:
    optim = dataclasses.replace(OPTIM, zero1=zero1)
    return ActorTrainer(MODEL, optim, BATCH, [0], GroupCache(timeout=30.0), seed=7, attention=attention)


def _state(trainer: ActorTrainer) -> dict[str, Any]:
    assert trainer.flat is not None and trainer.optimizer is not None
    return {"params": trainer.flat.data.clone(), "exp_avg": trainer.optimizer.exp_avg.clone(),
            "exp_avg_sq": trainer.optimizer.exp_avg_sq.clone(), "step": trainer.step,
            "consumed": trainer.consumed_samples, "rng": trainer.generator.get_state()}


def _device_tensors(trainer: ActorTrainer) -> list[torch.Tensor]:
    """Every tensor whose storage parking frees: parameters, gradients, flat buffers, moments."""
    assert trainer.model is not None and trainer.flat is not None
    opt = trainer.optimizer
    assert opt is not None
    params = list(trainer.model.parameters())
    return [*params, *(p.grad for p in params if p.grad is not None), trainer.flat.storage,
            trainer.flat.data, trainer.flat.grad, opt.exp_avg, opt.exp_avg_sq]


@pytest.fixture(scope="module", params=[(False, "local"), (True, "sdpa")], ids=["replicated", "zero1"])
def runs(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The same STEPS steps without parking and with park/unpark around every step (the replicated
    optimizer with megatron-core's unfused attention, ZeRO-1 with SDPA)."""
    zero1, attention = request.param
    ref = _trainer(zero1, attention)
    ref_metrics = [ref.train_step(make_batch(s, BATCH.global_batch_size)) for s in range(STEPS)]
    trainer = _trainer(zero1, attention)
    objects = [id(trainer.model), id(trainer.optimizer), id(trainer.flat),
               *map(id, _device_tensors(trainer))]
    out: dict[str, Any] = {"metrics": [], "figures": [], "rng_restored": [], "scratch": []}
    for step in range(STEPS):
        rng = torch.get_rng_state()
        out["figures"].append((trainer.park(), trainer.park()))  # the second is a no-op
        torch.rand(100)  # other work while parked moves the global RNG
        out["figures"][-1] += (trainer.unpark(), trainer.unpark())
        out["rng_restored"].append(torch.equal(torch.get_rng_state(), rng))
        out["metrics"].append(trainer.train_step(make_batch(step, BATCH.global_batch_size)))
        out["scratch"].append(trainer.park()["scratch_bytes"])
        trainer.unpark()
    out["same_objects"] = objects == [id(trainer.model), id(trainer.optimizer), id(trainer.flat),
                                      *map(id, _device_tensors(trainer))]
    out.update(ref_metrics=ref_metrics, ref=_state(ref), got=_state(trainer), trainer=trainer,
               numel=trainer.flat.numel if trainer.flat is not None else 0, attention=attention)
    return out


def test_parking_between_steps_is_bitwise_identical(runs: dict[str, Any]) -> None:
    assert [m["loss"] for m in runs["metrics"]] == [m["loss"] for m in runs["ref_metrics"]]
    assert runs["metrics"] == runs["ref_metrics"]  # grad norm, lr, consumed samples, step
    got, ref = runs["got"], runs["ref"]
    for key in ("params", "exp_avg", "exp_avg_sq", "rng"):
        assert torch.equal(got[key], ref[key]), key
    assert (got["step"], got["consumed"]) == (ref["step"], ref["consumed"]) == (
        STEPS, STEPS * BATCH.global_batch_size)
    assert runs["same_objects"]  # model, optimizer, flat buffers, parameters, moments reused
    assert all(runs["rng_restored"])


def test_park_figures_and_idempotence(runs: dict[str, Any]) -> None:
    numel = runs["numel"]
    for park, park_again, unpark, unpark_again in runs["figures"]:
        assert park["bytes"] == unpark["bytes"] == 12 * numel  # parameters + two Adam moments
        assert park["device_bytes"] == unpark["device_bytes"] == 16 * numel  # + gradients
        assert park["seconds"] > 0 and unpark["seconds"] > 0
        assert park_again == {"bytes": 0.0, "device_bytes": 0.0, "scratch_bytes": 0.0,
                              "seconds": 0.0}
        assert unpark_again == {"bytes": 0.0, "device_bytes": 0.0, "seconds": 0.0}
    # megatron's unfused attention keeps its scores in a scratch buffer: made again by every step, dropped
    # by every park; SDPA keeps none
    if runs["attention"] == "local":
        assert all(nbytes > 0 for nbytes in runs["scratch"]), runs["scratch"]
    else:
        assert runs["scratch"] == [0] * len(runs["scratch"])


def test_parked_actor_frees_storage_and_refuses_work(runs: dict[str, Any]) -> None:
    trainer: ActorTrainer = runs["trainer"]
    before = {n: t.clone() for n, t in trainer.named_parameters_for_sync()}
    assert not trainer.parked
    trainer.park()
    try:
        assert trainer.parked
        assert all(t.untyped_storage().nbytes() == 0 for t in _device_tensors(trainer))
        calls = {"train_step": lambda: trainer.train_step(make_batch(9, 8)),
                 "reshard": lambda: trainer.reshard([0, 1], epoch=3),
                 "state_dict": trainer.state_dict,
                 "forward of GPTModel": lambda: trainer.model(torch.zeros(1, 2, dtype=torch.long),
                                                              None, attention_mask=None)}
        for what, call in calls.items():
            with pytest.raises(ParkedError, match=what):
                call()
        # Weights can be sent to rollout ranks while the actor is parked: host copies.
        parked = dict(trainer.named_parameters_for_sync())
        assert parked.keys() == before.keys()
        assert all(torch.equal(parked[n], before[n]) for n in before)
        assert all(t.untyped_storage().nbytes() > 0 for t in parked.values())
        assert trainer.step == STEPS and trainer.meta()["step"] == STEPS  # Python state kept
    finally:
        trainer.unpark()
    assert not trainer.parked
    after = dict(trainer.named_parameters_for_sync())
    assert all(torch.equal(after[n], before[n]) for n in before)


def test_inactive_trainer_park_is_a_noop() -> None:
    trainer = ActorTrainer(MODEL, OPTIM, BATCH, [1], GroupCache(timeout=30.0), seed=7)
    assert set(trainer.park().values()) == {0.0} and not trainer.parked
    assert set(trainer.unpark().values()) == {0.0}


def test_free_while_parked_keeps_a_warm_skeleton_resident() -> None:
    trainer = _trainer(zero1=False)
    trainer.stay_warm = True
    trainer.park()
    trainer.free()
    assert not trainer.parked and trainer.warm_ready
    assert trainer.flat is not None and trainer.flat.storage.untyped_storage().nbytes() > 0


# ----------------------------------------------------------------- rollout and reference
def _new_weights(seed: int = 5) -> list[tuple[str, torch.Tensor]]:
    return [(n, t.detach().clone()) for n, t in build_hf_model(CFG, seed=seed).named_parameters()]


SEEDED = SamplingParams(max_new_tokens=6, seeds=(11, 12, 13), temperature=0.9)
CALL_SEED = SamplingParams(max_new_tokens=6, seed=4)


def test_released_rollout_engine_takes_weights_and_resumes_in_place() -> None:
    never, parked = HFRolloutEngine(CFG, seed=0), HFRolloutEngine(CFG, seed=0)
    params = list(parked.model.parameters())
    fig = parked.release()
    assert parked.released and fig["bytes"] > 0
    assert parked.release() == {"bytes": 0.0, "device_bytes": 0.0, "seconds": 0.0}
    assert all(p.untyped_storage().nbytes() == 0 for p in parked.model.parameters())
    with pytest.raises(RuntimeError, match="released"):
        parked.generate(PROMPTS, SEEDED)
    with pytest.raises(ParkedError, match="score"):
        parked.score(PROMPTS)
    with pytest.raises(ParkedError, match="forward"):
        parked.model(input_ids=torch.tensor([PROMPTS[0]]))
    new = _new_weights()
    parked.update_weights(new, version=3)  # into the host copies
    never.update_weights(new, version=3)
    assert parked.weight_version == 3
    assert all(p.untyped_storage().nbytes() == 0 for p in parked.model.parameters())
    assert parked.resume()["bytes"] == fig["bytes"]
    assert not parked.released and parked.resume()["bytes"] == 0
    assert all(a is b for a, b in zip(params, parked.model.parameters()))
    for sampling in (SEEDED, CALL_SEED):
        got, want = parked.generate(PROMPTS, sampling), never.generate(PROMPTS, sampling)
        assert [(g.token_ids, g.logprobs, g.weight_version) for g in got] == [
            (g.token_ids, g.logprobs, g.weight_version) for g in want]
    assert all(torch.equal(a, b) for a, b in zip(parked.score(PROMPTS), never.score(PROMPTS)))


def test_reference_scorer_park_round_trip() -> None:
    from slurm_rl.engines.inference import ReferenceScorer

    ref = ReferenceScorer(CFG, _new_weights())
    seqs = [p + [3, 4, 5] for p in PROMPTS]
    before = ref.score(seqs)
    fig = ref.park()
    assert ref.parked and fig["bytes"] > 0
    assert all(p.untyped_storage().nbytes() == 0 for p in ref.model.parameters())
    with pytest.raises(ParkedError, match="score"):
        ref.score(seqs)
    assert ref.unpark()["bytes"] == fig["bytes"] and not ref.parked
    assert all(torch.equal(a, b) for a, b in zip(ref.score(seqs), before))
    # the inference ranks' copy of the actor takes an iteration's weights while parked (a group's parked job)
    fresh = ReferenceScorer(CFG, _new_weights(seed=7))
    ref.park()
    ref.load_weights(fresh.model.named_parameters())
    assert all(p.untyped_storage().nbytes() == 0 for p in ref.model.parameters())
    ref.unpark()
    assert all(torch.equal(a, b) for a, b in zip(ref.score(seqs), fresh.score(seqs)))


# ----------------------------------------------------------------- the mechanics
def test_host_parking_shared_dropped_and_written_storages() -> None:
    flat = torch.arange(12, dtype=torch.float32)
    view, alias = flat[4:8].view(2, 2), flat[:6]
    grad = torch.full((5,), 7.0)
    parking = HostParking("test")
    fig = parking.park([view, alias, flat], drop=[grad, grad[1:]])
    assert fig["bytes"] == 48 and fig["device_bytes"] == 48 + 20  # each storage once
    assert all(t.untyped_storage().nbytes() == 0 for t in (flat, view, grad))
    host = parking.host_view(view)
    assert torch.equal(host, torch.tensor([[4.0, 5.0], [6.0, 7.0]]))
    host.fill_(-1.0)  # a write into the host copy is what unpark restores
    with pytest.raises(KeyError):
        parking.host_view(grad)
    parking.unpark()
    assert flat.tolist() == [0, 1, 2, 3, -1, -1, -1, -1, 8, 9, 10, 11]
    assert grad.tolist() == [0.0] * 5  # dropped: not copied, back zero-filled
    with pytest.raises(ValueError, match="not resizable"):
        HostParking("test").park([torch.from_numpy(flat.numpy().copy())])


def test_failed_unpark_stays_parked(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = torch.ones(4), torch.full((3,), 2.0)
    parking = HostParking("test")
    parking.park([a, b])
    real, calls = HostParking._copy_in, []

    def flaky(entry: Any) -> None:  # the second storage does not fit on the device
        calls.append(entry)
        if len(calls) == 2:
            raise MemoryError("device full")
        real(entry)

    monkeypatch.setattr(HostParking, "_copy_in", staticmethod(flaky))
    with pytest.raises(MemoryError):
        parking.unpark()
    assert parking.parked
    assert a.untyped_storage().nbytes() == b.untyped_storage().nbytes() == 0
    monkeypatch.undo()
    parking.unpark()
    assert a.tolist() == [1.0] * 4 and b.tolist() == [2.0] * 3
