"""A TP vLLM engine over several ranks of a run, one process per GPU (Slurm's model).

vLLM's ``external_launcher`` executor takes torch.distributed's whole world as the engine's, while a run's
world is its whole allocation. So each rank of a TP engine hosts its shard in a process of its own (the
*host*, ``python -m slurm_rl.engines.rollout.tp_host``) whose world is the engine's ranks only: the hosts meet
through a ``FileStore`` in the run directory, build the same engine (each holding its shard), and run every
call in lockstep. The engine's first rank (the rollout head that decodes for the engine) sends each call to
its host, which broadcasts it to the other hosts over a gloo group of the engine's world; the other ranks'
workers only hand their hosts the weights of each sync (vLLM's loader narrows a full tensor to its shard).

Worker and host talk over a socket pair: JSON messages (commands, prompts, generations) and, for weights, the
path of a safetensors file in the host's temporary directory. Every wait has a timeout and names what it
waited for; a host whose worker is gone exits.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch import Tensor

from slurm_rl.engines.errors import EngineStateError
from slurm_rl.engines.model_config import ModelConfig
from slurm_rl.engines.rollout.base import Generation, RolloutEngine, SamplingParams


def _send(conn: Connection, doc: Any) -> None:
    conn.send_bytes(json.dumps(doc).encode())


def _recv(conn: Connection, timeout_s: float | None, what: str) -> Any:
    if timeout_s is not None and not conn.poll(timeout_s):
        raise TimeoutError(f"no answer within {timeout_s:.0f} s while waiting for {what}")
    return json.loads(conn.recv_bytes())


def _write_weights(named: Iterable[tuple[str, Tensor]], directory: Path, version: int) -> Path:
    """The tensors in a safetensors file of ``directory`` (read and removed by the host)."""
    from safetensors.torch import save_file

    path = directory / f"weights-v{version}-{os.getpid()}-{time.monotonic_ns()}.safetensors"
    save_file({n: t.detach().to("cpu").contiguous() for n, t in named}, str(path))
    return path


class TPEngineRank(RolloutEngine):
    """This rank's part of a TP vLLM engine over ``world`` ranks: it starts the rank's host process and, on the
    engine's first rank (``index`` 0), forwards every call to it; on the others only weights and ``close``.
    ``engine_kwargs`` are :class:`~slurm_rl.engines.rollout.vllm_engine.VLLMRolloutEngine`'s."""

    def __init__(self, model_cfg: ModelConfig, index: int, world: int, store: str | Path, *, device: str = "cpu",
                 timeout_s: float = 600.0, engine_kwargs: dict[str, Any] | None = None) -> None:
        self.model_cfg, self.index, self.world, self.timeout_s = model_cfg, index, world, timeout_s
        self.weight_version = 0
        self._released = False
        self._tmp = tempfile.TemporaryDirectory(prefix="slurm_rl_tp_")
        spec = {"index": index, "world": world, "store": str(store), "device": device, "timeout_s": timeout_s,
                "model": dataclasses.asdict(model_cfg), "engine": engine_kwargs or {}, "parent": os.getpid(),
                "work_dir": self._tmp.name}
        ours, theirs = socket.socketpair()
        env = dict(os.environ, RANK=str(index), WORLD_SIZE=str(world), VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   LOCAL_RANK=str(index if device == "cpu" else 0), SLURM_RL_TP_HOST_FD=str(theirs.fileno()))
        if device.startswith("cuda"):  # the host sees this rank's GPU only
            physical = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
            current = torch.cuda.current_device() if torch.cuda.is_available() else 0
            env["CUDA_VISIBLE_DEVICES"] = physical[current] if physical != [""] else str(current)
        self.proc = subprocess.Popen([sys.executable, "-m", "slurm_rl.engines.rollout.tp_host", json.dumps(spec)],
                                     pass_fds=[theirs.fileno()], env=env)
        theirs.close()
        self.conn = Connection(ours.detach())
        ready = self._answer(f"rank {index} of a TP-{world} vLLM engine to start (store {store})")
        self.options = ready["options"]

    # -- plumbing ---------------------------------------------------------------------------------
    def _answer(self, what: str) -> Any:
        """The host's next answer (an error it reports is raised here)."""
        deadline = time.monotonic() + self.timeout_s
        while not self.conn.poll(1.0):
            if self.proc.poll() is not None:
                raise EngineStateError(f"the TP engine host of rank {self.index} exited with code "
                                       f"{self.proc.returncode} while waiting for {what}")
            if time.monotonic() > deadline:
                raise EngineStateError(f"no answer within {self.timeout_s:.0f} s while waiting for {what}")
        doc = json.loads(self.conn.recv_bytes())
        if "error" in doc:
            raise EngineStateError(f"TP engine host of rank {self.index}: {doc['error']}")
        return doc

    def _call(self, op: str, **args: Any) -> Any:
        if self.index != 0:
            raise EngineStateError(f"TPEngineRank.{op}: rank {self.index} of the engine does not drive it "
                                   "(its first rank does)")
        _send(self.conn, {"op": op, **args})
        return self._answer(f"the TP engine's {op}")

    # -- RolloutEngine ----------------------------------------------------------------------------
    @property
    def released(self) -> bool:
        return self._released

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        doc = self._call("generate", prompts=[list(map(int, p)) for p in prompts],
                         sampling=dataclasses.asdict(sampling))
        return [Generation(**g) for g in doc["generations"]]

    def score(self, sequences: Sequence[Sequence[int]]) -> list[Tensor]:
        doc = self._call("score", sequences=[list(map(int, s)) for s in sequences])
        return [torch.tensor(v, dtype=torch.float32) for v in doc["scores"]]

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Every rank hands its host the weights; the engine's first rank also says when to load them."""
        path = _write_weights(named_tensors, Path(self._tmp.name), version)
        if self.index == 0:
            _send(self.conn, {"op": "update", "version": version})
        _send(self.conn, {"weights": str(path)})
        if self.index == 0:
            self._answer(f"the TP engine to load weights v{version}")
        self.weight_version = version

    def release(self) -> None:
        if not self._released and self.index == 0:
            self._call("release")
        self._released = True

    def resume(self) -> None:
        if self._released and self.index == 0:
            self._call("resume")
        self._released = False

    def close(self) -> None:
        """The first rank tells every host to stop; each rank waits for its own host to exit."""
        if self.proc.poll() is None and self.index == 0:
            try:
                _send(self.conn, {"op": "close"})
            except OSError:
                pass
        try:
            self.proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()
        self._tmp.cleanup()


# -- the host process ----------------------------------------------------------------------------
def _exit_with_parent(parent: int) -> None:
    """End this process once its worker is gone (it would otherwise wait in a collective)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(3)

    threading.Thread(target=watch, daemon=True, name="tp-host-parent").start()


def _serve(conn: Connection, spec: dict[str, Any]) -> None:
    import datetime

    import torch.distributed as dist
    from safetensors.torch import load_file

    from slurm_rl.engines.rollout.vllm_engine import VLLMRolloutEngine

    index, world, device = int(spec["index"]), int(spec["world"]), spec["device"]
    timeout = datetime.timedelta(seconds=float(spec["timeout_s"]))
    backend = "cuda:nccl,cpu:gloo" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=f"file://{spec['store']}", rank=index, world_size=world,
                            timeout=timeout)
    commands = dist.new_group(backend="gloo", timeout=timeout)  # calls travel from host memory
    model_cfg = ModelConfig(**spec["model"])
    engine = VLLMRolloutEngine(model_cfg, device=device, ranks=world, work_dir=spec["work_dir"], **spec["engine"])
    _send(conn, {"options": {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
                             for k, v in engine.options.items()}})
    while True:
        box = [json.loads(conn.recv_bytes()) if index == 0 else None]
        dist.broadcast_object_list(box, src=0, group=commands)
        call = box[0]
        op = call["op"]
        try:
            if op == "close":
                engine.close()
                return
            if op == "generate":
                gens = engine.generate(call["prompts"], SamplingParams(**{
                    k: tuple(v) if isinstance(v, list) else v for k, v in call["sampling"].items()}))
                answer: dict[str, Any] = {"generations": [dataclasses.asdict(g) for g in gens]}
            elif op == "score":
                answer = {"scores": [t.tolist() for t in engine.score(call["sequences"])]}
            elif op == "update":
                path = Path(_recv(conn, float(spec["timeout_s"]), f"weights v{call['version']}")["weights"])
                weights = load_file(str(path))
                path.unlink()
                engine.update_weights(weights.items(), version=int(call["version"]))
                answer = {"version": engine.weight_version}
            elif op in ("release", "resume"):
                getattr(engine, op)()
                answer = {}
            else:
                answer = {"error": f"unknown call {op!r}"}
        except Exception as exc:  # reported to the worker, which fails the run with it
            answer = {"error": f"{op}: {type(exc).__name__}: {exc}"}
        errors: list[Any] = [None] * world  # every host's outcome: a shard's failure is the engine's
        dist.all_gather_object(errors, answer.get("error"), group=commands)
        if index == 0:
            failed = [f"rank {i} of the engine: {e}" for i, e in enumerate(errors) if e]
            _send(conn, {"error": "; ".join(failed)} if failed else answer)


def main() -> int:
    spec = json.loads(sys.argv[1])
    conn = Connection(int(os.environ["SLURM_RL_TP_HOST_FD"]))
    _exit_with_parent(int(spec["parent"]))
    try:
        _serve(conn, spec)
    except Exception as exc:
        try:
            _send(conn, {"error": f"{type(exc).__name__}: {exc}"})
        except OSError:
            pass
        raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
