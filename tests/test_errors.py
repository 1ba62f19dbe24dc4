"""One error hierarchy: every exception class of the package is a ``SlurmRLError`` in one family,
keeps the builtin base its callers catch, and the command line maps the families to exit codes
(2 bad input, 1 any other failure) with a traceback only under ``--debug``."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from emulated_configs import emulated_config, write_config
from slurm_rl import cli
from slurm_rl import errors as E
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "slurm_rl"
FAMILIES = (E.InputError, E.ControlError, E.DataPlaneError, E.EngineError, E.WorkerError, E.SchedulerError,
            E.LaunchError, E.WaitTimeout)


def _modules() -> list[str]:
    """Every module of the package (namespace directories included), as import names."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _exception_classes() -> tuple[list[type[BaseException]], list[str]]:
    """Exception classes defined in the package's modules; modules whose optional dependencies are
    missing here are listed apart."""
    found: dict[str, type[BaseException]] = {}
    skipped = []
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.startswith("slurm_rl"):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values()), skipped


def test_every_exception_class_of_the_package_is_a_slurm_rl_error_of_one_family() -> None:
    classes, skipped = _exception_classes()
    assert len(classes) >= 40, (len(classes), skipped)
    outside = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, E.SlurmRLError)]
    assert outside == []
    family_less = [f"{c.__module__}.{c.__qualname__}" for c in classes
                   if c is not E.SlurmRLError and not issubclass(c, FAMILIES)
                   and c.__qualname__ != "StorageError"]  # fsio's, a family of its own (OSError)
    assert family_less == []


def test_timeouts_are_one_family_and_still_timeout_errors() -> None:
    classes, _ = _exception_classes()
    timeouts = {c.__name__ for c in classes if issubclass(c, TimeoutError)}
    assert {"WaitTimeout", "AckTimeout", "ManifestTimeout", "GroupTimeoutError", "ReshardTimeoutError",
            "LocalRanksTimeout", "NoProgressTimeout", "GroupTimeout"} <= timeouts
    assert all(issubclass(c, E.WaitTimeout) for c in classes if issubclass(c, TimeoutError)), timeouts


def test_existing_names_keep_their_builtin_bases_and_import_paths() -> None:
    from slurm_rl.config import ConfigError
    from slurm_rl.control.errors import AckTimeout, ControlError, TornFileError, WaitTimeout
    from slurm_rl.data.errors import DataPlaneError, ManifestTimeout
    from slurm_rl.engines.errors import EngineStateError
    from slurm_rl.launch.local import LaunchError
    from slurm_rl.launch.submit import SubmitError
    from slurm_rl.placement import ConfigError as PlacementConfigError
    from slurm_rl.scheduler.errors import SimulationError
    from slurm_rl.worker.errors import CoordinatorFailed, ProtocolError

    assert ConfigError is PlacementConfigError and issubclass(ConfigError, (E.InputError, ValueError))
    assert issubclass(SubmitError, ValueError) and issubclass(TornFileError, ValueError)
    assert ControlError is E.ControlError and WaitTimeout is E.WaitTimeout and LaunchError is E.LaunchError
    assert issubclass(AckTimeout, ControlError) and issubclass(AckTimeout, TimeoutError)
    assert issubclass(ManifestTimeout, DataPlaneError) and issubclass(ManifestTimeout, TimeoutError)
    # what replaced a bare RuntimeError is still one (``except RuntimeError`` callers, the simulate command)
    for cls in (EngineStateError, SimulationError, CoordinatorFailed, ProtocolError, DataPlaneError, LaunchError):
        assert issubclass(cls, RuntimeError), cls


def test_a_failed_coordinator_is_one_class_whichever_way_it_is_seen() -> None:
    from slurm_rl.control.status import CoordinatorStatus
    from slurm_rl.worker.errors import CoordinatorFailed

    def status(**doc: object) -> CoordinatorStatus:
        return CoordinatorStatus.from_json({"generation": 1, **doc}, "coordinator.json")

    CoordinatorFailed.check(None, "rank 1 (host h)")
    CoordinatorFailed.check(status(state="running"), "rank 1 (host h)")
    with pytest.raises(CoordinatorFailed, match=r"^coordinator failed: DeadRankError: x; rank 1 \(host h\) stops "
                                                r"in iteration 4$"):
        CoordinatorFailed.check(status(state="failed", error="DeadRankError: x"), "rank 1 (host h)", " in iteration 4")


# -- exit codes ---------------------------------------------------------------------------------

def _bad_config(tmp_path: Path) -> Path:
    cfg = emulated_config(tmp_path / "run")
    cfg["train"]["num_iterations"] = -3
    return write_config(tmp_path / "bad.yaml", cfg)


def _raising(exc: BaseException):  # type: ignore[no-untyped-def]
    def command(args: object) -> int:
        raise exc
    return command


def test_cli_config_error_exits_2_with_the_message_and_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, "validate", str(_bad_config(tmp_path))],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == cli.EXIT_BAD_INPUT, proc.stderr
    assert "train.num_iterations" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("exc, code, needle", [
    (E.InputError("submit --executor: got 'x'; allowed: slurm | local"), 2, "error: submit --executor: got 'x'"),
    (E.ControlError("rank 3 (host n1): heartbeat 30s old"), 1, "error: rank 3 (host n1): heartbeat 30s old"),
    (E.WaitTimeout("rank 2 waited 60s for epoch 4"), 1, "error: rank 2 waited 60s for epoch 4"),
    (KeyError("boundary_at"), 1, "error: KeyError: 'boundary_at'"),
])
def test_cli_maps_errors_to_exit_codes_without_a_traceback(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str],
                                                           exc: Exception, code: int, needle: str) -> None:
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    monkeypatch.setitem(cli.COMMANDS, "validate", _raising(exc))
    assert cli.main(["validate", "c.yaml"]) == code
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err


@pytest.mark.parametrize("how", ["before", "after", "env"])
def test_cli_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                       how: str) -> None:
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    monkeypatch.setitem(cli.COMMANDS, "validate", _raising(E.ControlError("epoch 7 is fenced")))
    argv = {"before": ["--debug", "validate", "c.yaml"], "after": ["validate", "c.yaml", "--debug"],
            "env": ["validate", "c.yaml"]}[how]
    if how == "env":
        monkeypatch.setenv(cli.DEBUG_ENV, "1")
    assert cli.main(argv) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ControlError: epoch 7 is fenced" in err
    assert err.rstrip().endswith("error: epoch 7 is fenced"), err


def test_cli_debug_flag_given_before_the_command_is_kept() -> None:
    args = cli._parser().parse_args(["--debug", "validate", "c.yaml"])
    assert args.debug is True
    assert cli._parser().parse_args(["validate", "c.yaml"]).debug is False


def test_local_rendezvous_ports_are_drawn_below_the_ephemeral_range() -> None:
    """bind(0) would give an ephemeral port, which an outgoing connection may take before rank 0
    binds it; the local launcher draws from the ports below the kernel's ephemeral range."""
    import socket
    from pathlib import Path

    from slurm_rl.launch.local import PORT_WINDOW, _free_port

    floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {_free_port() for _ in range(20)}
    assert all(floor - PORT_WINDOW <= p < floor for p in ports) and len(ports) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))  # free when given
