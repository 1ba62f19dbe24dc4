"""Reward functions: the built-ins (gsm8k, math, exact), resolving ``reward.name`` / ``reward.fn``,
and :class:`RewardRunner` scoring in real worker processes (errors, bad values, timeouts, a dead
worker, and the pool working on afterwards)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_rl.engines.errors import EngineStateError
from slurm_rl.errors import EngineError, InputError, WaitTimeout
from slurm_rl.placement import ConfigError
from slurm_rl.rewards import (BUILTIN, RewardError, RewardResult, RewardRunner, RewardSample, RewardTimeout,
                              resolve_reward, reward_problems)
from slurm_rl.rewards.builtin import exact, gsm8k
from slurm_rl.rewards.builtin import math as math_reward

USER_REWARDS = '''
import math
import os
import threading
import time

NOT_CALLABLE = 3


def score(prompt, response, answer, extra):
    return 1.0 if response.strip() == str(answer) else 0.0


def scaled(prompt, response, answer, extra):
    """Reads a file relative to the working directory: the worker runs in the caller's."""
    with open("scale.txt") as f:
        return float(f.read()) * len(response)


def boom(prompt, response, answer, extra):
    if extra.get("boom"):
        raise ValueError(f"boom on {response!r}")
    return 1.0


def misbehave(prompt, response, answer, extra):
    if "sleep" in extra:
        time.sleep(extra["sleep"])
    if "exit" in extra:
        os._exit(extra["exit"])
    if "interrupt" in extra:
        raise KeyboardInterrupt
    if "value" in extra:
        return extra["value"]
    if "main_thread" in extra:  # math-verify's signal.alarm timeouts need it
        return float(threading.current_thread() is threading.main_thread())
    return 0.5
'''


@pytest.fixture
def user_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package ``rw_<hex>`` with module ``rewards`` (USER_REWARDS) in tmp_path, the working dir;
    sys.path and sys.modules are restored afterwards."""
    pkg = f"rw_{uuid.uuid4().hex[:10]}"
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / pkg / "rewards.py").write_text(textwrap.dedent(USER_REWARDS))
    (tmp_path / "broken_mod.py").write_text("import definitely_not_a_module_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader puts the working dir on it
    yield pkg
    for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".") or m == "broken_mod"]:
        del sys.modules[name]


def _samples(responses: list[str], answer: object = "", extras: dict[int, dict] | None = None,
             first_id: int = 0) -> list[RewardSample]:
    extras = extras or {}
    return [RewardSample(first_id + i, "prompt", r, answer, extras.get(i, {})) for i, r in enumerate(responses)]


# ---------------------------------------------------------------- built-in rewards, in process

@pytest.mark.parametrize(("response", "answer", "expected"), [
    ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "She sold 48/2 = 24 in May.\n#### 72", 1.0),
    ("The answer is 72", "#### 72", 1.0),                      # no ####: the last number
    ("The answer is 72.", "#### 72", 1.0),                     # a full stop is no decimal point
    ("#### 1,234", "#### 1234", 1.0),                          # commas dropped on both sides
    ("so 1234 in all\n#### 1234", "#### 1,234", 1.0),
    ("#### 7.0", "7", 1.0),                                    # compared as numbers
    ("#### 7", 7, 1.0),                                        # a bare int ground truth
    ("#### -3", "#### -3", 1.0),
    ("#### $15", "#### 15", 1.0),
    ("#### 72 then I said 5", "#### 72", 1.0),                 # the number after ####, not the last
    ("I think 72, no wait, 71", "#### 72", 0.0),               # wrong number
    ("#### 73", "#### 72", 0.0),
    ("#### 72\n#### 12", "#### 72", 0.0),                      # the last #### counts
    ("7200", "#### 72", 0.0),
    ("I do not know.", "#### 72", 0.0),                        # no number at all
    ("", "#### 72", 0.0),
])
def test_gsm8k(response: str, answer: object, expected: float) -> None:
    assert gsm8k("q", response, answer, {}) == expected


@pytest.mark.parametrize("answer", ["no number here", "#### many", None, True, [72]])
def test_gsm8k_unreadable_ground_truth_raises(answer: object) -> None:
    with pytest.raises(ValueError, match="gsm8k"):
        gsm8k("q", "#### 72", answer, {})


@pytest.mark.parametrize(("response", "answer", "expected"), [
    ("The answer is 0.5", r"\boxed{\frac{1}{2}}", 1.0),
    (r"so we get $\boxed{\frac{1}{2}}$", "0.5", 1.0),
    (r"hence $\sqrt{4}$", "2", 1.0),
    ("It is 2.", r"$\sqrt{4}$", 1.0),
    (r"$x = \frac{3}{4}$", r"\frac34", 1.0),
    (r"$\boxed{3}$", "2", 0.0),                                # wrong
    ("I have no idea", "2", 0.0),                              # nothing to parse
])
def test_math(response: str, answer: str, expected: float) -> None:
    assert math_reward("q", response, answer, {}) == expected


def test_math_outside_the_main_thread_runs_without_signal_timeouts() -> None:
    """math-verify's signal.alarm timeouts raise outside a main thread: the reward turns them off."""
    out: list[object] = []
    worker = threading.Thread(target=lambda: out.append(math_reward("q", r"$\boxed{0.5}$", r"\frac{1}{2}", {})))
    worker.start()
    worker.join()
    assert out == [1.0]


def test_math_unparsable_ground_truth_raises() -> None:
    with pytest.raises(ValueError, match="cannot parse the answer"):
        math_reward("q", "1", "", {})


@pytest.mark.parametrize(("response", "answer", "expected"), [
    ("Paris", "Paris", 1.0), ("  Paris\n", " Paris ", 1.0), ("paris", "Paris", 0.0), ("42", 42, 1.0),
])
def test_exact(response: str, answer: object, expected: float) -> None:
    assert exact("q", response, answer, {}) == expected


def test_builtin_table_is_read_only() -> None:
    assert set(BUILTIN) == {"gsm8k", "gsm8k_strict", "math", "exact", "auto"} and BUILTIN["gsm8k"] is gsm8k
    with pytest.raises(TypeError):
        BUILTIN["mine"] = exact  # type: ignore[index]


# ---------------------------------------------------------------- resolving reward.name / reward.fn

@pytest.mark.parametrize(("name", "fn", "key", "allowed"), [
    (None, None, "reward.name", "exactly one of reward.name"),
    ("gsm8k", "{pkg}.rewards:score", "reward.name", "exactly one of reward.name"),
    ("gsm9k", None, "reward.name", "one of auto, exact, gsm8k, gsm8k_strict, math"),
    (None, "{pkg}.rewards.score", "reward.fn", "'package.module:function'"),
    (None, "{pkg}/rewards:score", "reward.fn", "'package.module:function'"),
    (None, "{pkg}.rewards:score:x", "reward.fn", "'package.module:function'"),
    (None, "{pkg}.nothere:score", "reward.fn", "module '{pkg}.nothere' does not import: No module named"),
    (None, "broken_mod:f", "reward.fn", "module 'broken_mod' does not import: No module named "
                                        "'definitely_not_a_module_xyz'"),
    (None, "{pkg}.rewards:absent", "reward.fn", "has no attribute 'absent'"),
    (None, "{pkg}.rewards:NOT_CALLABLE", "reward.fn", "'NOT_CALLABLE' is a int, not callable"),
])
def test_bad_reward_specs_are_reported(user_pkg: str, name: str | None, fn: str | None, key: str,
                                       allowed: str) -> None:
    fn = fn.format(pkg=user_pkg) if fn else fn
    problems = reward_problems(name, fn)
    assert len(problems) == 1
    got_key, value, got_allowed = problems[0]
    assert got_key == key and value == (name if key == "reward.name" else fn)
    assert allowed.format(pkg=user_pkg) in got_allowed
    with pytest.raises(ConfigError) as info:
        resolve_reward(name, fn)
    assert isinstance(info.value, InputError) and key in str(info.value)
    with pytest.raises(ConfigError):  # the runner checks before it starts any process
        RewardRunner(name, fn)


def test_good_specs_resolve(user_pkg: str) -> None:
    assert reward_problems("math", None) == []
    assert resolve_reward("exact", None) is exact
    fn = resolve_reward(None, f"{user_pkg}.rewards:score")  # found through the working directory
    assert fn("q", "x", "x", {}) == 1.0


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"timeout_s": 0}, "reward.timeout_s"), ({"on_error": "ignore"}, "reward.on_error"),
    ({"workers": -1}, "reward.workers"), ({"workers": True}, "reward.workers"),
])
def test_bad_runner_settings(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        RewardRunner("exact", **kwargs)


# ---------------------------------------------------------------- RewardRunner, real worker processes

def test_runner_scores_builtins_in_order() -> None:
    responses = ["#### 3", "the answer is 4", "#### 1,000", "no idea"]
    with RewardRunner("gsm8k", timeout_s=10.0) as runner:
        result = runner.score([RewardSample(10 + i, "q", r, a, {})
                               for i, (r, a) in enumerate(zip(responses, ["#### 3", "5", "1000", "1"]))])
        assert result == RewardResult(values=[1.0, 0.0, 1.0, 0.0], errors=0, timeouts=0)
        assert runner.score([]) == RewardResult(values=[])
    with pytest.raises(EngineStateError, match="after close"):
        runner.score(_samples(["1"]))


def test_runner_math_works_in_the_workers() -> None:
    """math-verify's signal timeouts run in the workers' main threads."""
    with RewardRunner("math", workers=1) as runner:
        result = runner.score(_samples([r"$\boxed{\frac{1}{2}}$", "0.4"], answer="0.5"))
    assert result.values == [1.0, 0.0] and result.errors == 0


def test_user_reward_runs_in_the_callers_working_directory(user_pkg: str, tmp_path: Path) -> None:
    (tmp_path / "scale.txt").write_text("0.25")
    with RewardRunner(fn=f"{user_pkg}.rewards:scaled", workers=1) as runner:
        assert runner.score(_samples(["ab", "abcd"])).values == [0.5, 1.0]
    with RewardRunner(fn=f"{user_pkg}.rewards:score", workers=2) as runner:
        result = runner.score(_samples(["a", "b", " a "], answer="a"))
        assert result.values == [1.0, 0.0, 1.0]


def test_raising_reward_names_function_sample_and_exception(user_pkg: str) -> None:
    fn = f"{user_pkg}.rewards:boom"
    with RewardRunner(fn=fn, on_error="raise") as runner:
        with pytest.raises(RewardError) as info:
            runner.score(_samples(["fine", "bad"], extras={1: {"boom": True}}, first_id=40))
        err = info.value
        assert isinstance(err, EngineError) and isinstance(err, RuntimeError)
        assert not isinstance(err, TimeoutError)
        assert (err.reward, err.sample_id, err.kind) == (fn, 41, "error")
        message = str(err)
        assert fn in message and "sample 41" in message and "ValueError: boom on 'bad'" in message
        assert "worker traceback" in message and "rewards.py" in message
        again = pickle.loads(pickle.dumps(err))
        assert str(again) == message and again.sample_id == 41
        assert runner.score(_samples(["fine"])).values == [1.0]  # a fresh pool after the raise


def test_errors_score_zero_and_are_counted(user_pkg: str) -> None:
    fn = f"{user_pkg}.rewards:misbehave"
    bad = {1: {"value": float("nan")}, 2: {"value": "1.0"}, 3: {"value": None}, 4: {"value": float("inf")},
           5: {"exit": 3}, 6: {"value": True}, 7: {"main_thread": True}, 8: {"unpicklable": lambda: 0},
           9: {"value": 10**400}}
    with RewardRunner(fn=fn, on_error="zero") as runner:
        result = runner.score(_samples(["r"] * 11, extras=bad))
        assert result == RewardResult(values=[0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5], errors=7,
                                      timeouts=0)
    with RewardRunner(fn=fn, on_error="raise") as runner:
        with pytest.raises(RewardError, match=r"returned nan \(float\), not a finite real number on sample 7"):
            runner.score(_samples(["r"], extras={0: {"value": float("nan")}}, first_id=7))
        with pytest.raises(RewardError, match=r"sample 8: its worker process died \(exit code 3\)"):
            runner.score(_samples(["r"], extras={0: {"exit": 3}}, first_id=8))


def test_zero_workers_score_in_this_process_with_the_same_outcomes(user_pkg: str) -> None:
    """``workers=0`` (verl's naive reward manager): no process is started; values, errors, their counts
    and the raised errors are those of the pool, and a sample that returns after ``timeout_s`` is a timeout."""
    import multiprocessing

    fn = f"{user_pkg}.rewards:misbehave"
    bad = {1: {"value": float("nan")}, 2: {"value": "1.0"}, 3: {"value": None}, 4: {"value": float("inf")},
           6: {"value": True}, 7: {"main_thread": True}, 9: {"value": 10**400}, 10: {"sleep": 0.3}}
    before = multiprocessing.active_children()
    with RewardRunner(fn=fn, on_error="zero", timeout_s=0.2, workers=0) as runner:
        assert runner._pool is None
        result = runner.score(_samples(["r"] * 11, extras=bad))
        assert multiprocessing.active_children() == before
    assert result == RewardResult(values=[0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 0.5, 0.0, 0.0], errors=5,
                                  timeouts=1)
    with RewardRunner(fn=fn, on_error="raise", timeout_s=0.2, workers=0) as runner:
        with pytest.raises(RewardError, match=r"returned nan \(float\), not a finite real number on sample 7"):
            runner.score(_samples(["r"], extras={0: {"value": float("nan")}}, first_id=7))
        with pytest.raises(RewardTimeout, match=r"sample 8 \(reward.timeout_s=0.2 s\): it returned after 0\.[3-9]"):
            runner.score(_samples(["r"], extras={0: {"sleep": 0.3}}, first_id=8))
        assert runner.score(_samples(["r"])).values == [0.5]
    with RewardRunner(fn=f"{user_pkg}.rewards:boom", on_error="raise", workers=0) as runner:
        with pytest.raises(RewardError, match=r"sample 41: ValueError: boom on 'bad'"):
            runner.score(_samples(["fine", "bad"], extras={1: {"boom": True}}, first_id=40))
    with pytest.raises(EngineStateError, match="after close"):
        runner.score(_samples(["r"]))


def test_zero_workers_let_the_callers_interrupt_through(user_pkg: str) -> None:
    """In the rank's own process a KeyboardInterrupt is the rank's, not the sample's error."""
    with RewardRunner(fn=f"{user_pkg}.rewards:misbehave", on_error="zero", workers=0) as runner:
        with pytest.raises(KeyboardInterrupt):
            runner.score(_samples(["r", "r"], extras={1: {"interrupt": True}}))


def test_a_pool_that_breaks_mid_batch_is_started_again_once_and_the_batch_completes(user_pkg: str) -> None:
    """A fault seen once in a CI run: the pool's named semaphores were gone from /dev/shm while a batch ran,
    the worker started in place of one a sample had killed could not open them and died, and pebble broke
    the whole pool ("All workers expired"), failing the batch. Caused here for real: the live pool's
    semaphores are unlinked, then a sample kills its worker. The runner starts a fresh pool once and scores
    there what was not scored yet; the killed sample's error is counted once."""
    fn = f"{user_pkg}.rewards:misbehave"
    with RewardRunner(fn=fn, on_error="zero", workers=1) as runner:
        assert runner.score(_samples(["r"])).values == [0.5]
        mutex = runner._pool._pool_manager.worker_manager.workers_channel.mutex
        for lock in (mutex.reader_mutex, mutex.writer_mutex):
            os.unlink(f"/dev/shm/sem.{lock._semlock.name.lstrip('/')}")
        result = runner.score(_samples(["r"] * 4, extras={1: {"exit": 3}}))
        assert result == RewardResult(values=[0.5, 0.0, 0.5, 0.5], errors=1, timeouts=0)
        assert runner.score(_samples(["r"])).values == [0.5]  # the fresh pool goes on


def test_timeout_kills_the_worker_and_the_pool_goes_on(user_pkg: str) -> None:
    fn = f"{user_pkg}.rewards:misbehave"
    with RewardRunner(fn=fn, timeout_s=0.5, on_error="raise", workers=2) as runner:
        with pytest.raises(RewardTimeout) as info:
            runner.score(_samples(["r", "r"], extras={1: {"sleep": 60}}, first_id=20))
        err = info.value
        assert isinstance(err, RewardError) and isinstance(err, WaitTimeout) and isinstance(err, TimeoutError)
        assert (err.sample_id, err.kind) == (21, "timeout")
        assert fn in str(err) and "sample 21" in str(err) and "timed out" in str(err)
        assert "reward.timeout_s=0.5 s" in str(err)
    with RewardRunner(fn=fn, timeout_s=0.5, on_error="zero", workers=2) as runner:
        result = runner.score(_samples(["r"] * 4, extras={2: {"sleep": 60}}))
        assert result == RewardResult(values=[0.5, 0.5, 0.0, 0.5], errors=0, timeouts=1)
        assert runner.score(_samples(["r"] * 4)).values == [0.5] * 4  # the hung worker was replaced


_GATED = '''
import os, time


def gated(prompt, response, answer, extra):
    """Says it is scoring, then scores once the gate file exists."""
    open(f"entered.{os.getpid()}", "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists("gate") and time.monotonic() < deadline:
        time.sleep(0.005)
    return 1.0
'''

_SIGNALLED = '''
import glob, os, signal, subprocess, sys, threading, time


def main() -> None:
    got = []
    signal.signal(signal.SIGUSR1, lambda *a: got.append("usr1"))
    from slurm_rl.rewards import RewardRunner, RewardSample
    runner = RewardRunner(fn="gated_reward:gated", workers=2)
    samples = [RewardSample(i, "p", "a", "a", {}) for i in range(8)]

    def stop_signals() -> None:  # Slurm's --signal (sbatch/train.sh: USR1), submitit's USR2, preemption's TERM
        deadline = time.monotonic() + 60
        while not glob.glob("entered.*") and time.monotonic() < deadline:  # a worker is inside the reward
            time.sleep(0.005)
        for pid in subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout.split():
            for p in [pid] + subprocess.run(["pgrep", "-P", pid], capture_output=True, text=True).stdout.split():
                for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
                    os.kill(int(p), sig)
        os.kill(os.getpid(), signal.SIGUSR1)
        open("gate", "w").close()

    threading.Thread(target=stop_signals).start()
    result = runner.score(samples)
    runner.close()
    print(sum(result.values), result.errors, got, len(glob.glob("entered.*")) > 0)


if __name__ == "__main__":
    main()
'''


def test_stop_signals_to_every_process_leave_the_workers_scoring(tmp_path: Path) -> None:
    """A rank asked to checkpoint (USR1 / USR2 / TERM to every process of the step) keeps scoring:
    its reward workers, signalled while inside the reward function, never see those signals; the rank
    still gets its own."""
    script = tmp_path / "signalled.py"
    script.write_text(_SIGNALLED)
    (tmp_path / "gated_reward.py").write_text(_GATED)
    repo = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), repo])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["8.0", "0", "['usr1']", "True"], proc.stdout + proc.stderr[-2000:]


def test_auto_routes_by_data_source_as_verl_does() -> None:
    from slurm_rl.rewards.builtin import BUILTIN

    auto = BUILTIN["auto"]
    assert auto("q", "so #### 72", "72", {"data_source": "openai/gsm8k"}) == 1.0
    assert auto("q", "so #### 71", "72", {"data_source": "openai/gsm8k"}) == 0.0
    assert auto("q", r"\boxed{\frac{1}{2}}", "0.5", {"data_source": "HuggingFaceH4/MATH-500"}) == 1.0
    # verl's gsm8k is strict: no '#### N', no reward (ours, gsm8k, falls back to the last number)
    assert auto("q", "the answer is 72", "72", {"data_source": "openai/gsm8k"}) == 0.0
    assert BUILTIN["gsm8k"]("q", "the answer is 72", "72", {}) == 1.0
    with pytest.raises(ValueError, match="no reward for data_source 'my/set'.*openai/gsm8k"):
        auto("q", "72", "72", {"data_source": "my/set"})
    with pytest.raises(ValueError, match="data_source None"):
        auto("q", "72", "72", {})


def test_gsm8k_strict_is_verls_default_gsm8k_score() -> None:
    import re

    from slurm_rl.rewards.builtin import gsm8k_strict

    def verl(solution_str: str, ground_truth: str) -> float:  # verl.utils.reward_score.gsm8k, method="strict"
        solution_str = solution_str[-300:]
        solutions = re.findall("#### (\\-?[0-9\\.\\,]+)", solution_str)
        final_answer = None if len(solutions) == 0 else solutions[-1].replace(",", "").replace("$", "")
        if final_answer is None:
            return 0
        return 1.0 if final_answer == ground_truth else 0.0

    cases = [("#### 72", "72"), ("so #### 1,234", "1234"), ("#### 7.0", "7"), ("72", "72"), ("####72", "72"),
             ("#### -3 then #### 5", "5"), ("#### $5", "5"), ("x" * 400 + "#### 9", "9"), ("#### 9" + "x" * 400, "9"),
             ("#### 72.", "72")]
    for response, gold in cases:
        assert gsm8k_strict("q", response, gold, {}) == verl(response, gold), (response, gold)
        assert gsm8k_strict("q", response, f"steps #### {gold}", {}) == verl(response, gold)
    assert sum(verl(r, g) for r, g in cases) >= 3  # both outcomes are covered
    with pytest.raises(ValueError):
        gsm8k_strict("q", "#### 1", "no number", {})
