#!/usr/bin/env python3
"""Show the suite ledger that the last whole-suite run wrote, or compare two ledgers.

    python tools/test_budget.py                      # .test-ledger/latest.json against the 720 s budget
    python tools/test_budget.py --compare OLD NEW    # two ledgers (files, or N: the N-th last of history.jsonl)
    python tools/test_budget.py --json               # the ledger itself

The ledger is written by tests/suite_ledger.py at the end of every whole-suite run
(``bash tools/test.sh``): pytest time, the machine's CPU time, and the 20 costliest tests.
Exit code 1 when the ledger's pytest time is over the budget, 2 when there is no ledger.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

LEDGER_DIR = Path(__file__).resolve().parents[1] / ".test-ledger"
BUDGET_S = 720.0


def load(ref: str) -> dict:
    """A ledger by file path, or by position in history.jsonl (-1: the last)."""
    if ref.lstrip("-").isdigit():
        lines = (LEDGER_DIR / "history.jsonl").read_text().splitlines()
        return json.loads(lines[int(ref)])
    return json.loads(Path(ref).read_text())


def _machine_share(doc: dict) -> str:
    """What the machine spent for itself meanwhile (ledgers from before these fields: nothing)."""
    if "kernel_threads_cpu_s" not in doc:
        return ""
    zygotes = f"; zygotes and what they forked {doc['zygote_cpu_s']:.0f} s" if "zygote_cpu_s" in doc else ""
    return f"; of it kernel threads {doc['kernel_threads_cpu_s']:.0f} s; steal {doc['steal_s']:.0f} s{zygotes}"


def show(doc: dict, budget: float) -> str:
    lines = [f"pytest {doc['pytest_s']:.0f} s of a {budget:.0f} s budget "
             f"({'within' if doc['pytest_s'] <= budget else 'OVER'}), machine CPU {doc['machine_cpu_s']:.0f} s "
             f"({doc['cores_busy']:.2f} cores busy{_machine_share(doc)}), outcomes {doc['counts']}, "
             f"finished {doc['finished_at']}{_speed(doc)}"]
    lines += [f"{t['wall_s']:8.1f} s wall {t['cpu_s']:8.1f} s cpu  {t['test']}" for t in doc["costliest"]]
    return "\n".join(lines)


def _speed(doc: dict) -> str:
    """The host's speed beside the time (a fixed CPU workload's seconds; ledgers before it have none)."""
    speed = doc.get("host_speed_s")
    return f", host speed {speed['start']:.3f}/{speed['end']:.3f} s (start/end)" if speed else ""


def compare(old: dict, new: dict) -> str:
    lines = [f"pytest {old['pytest_s']:.0f} s -> {new['pytest_s']:.0f} s, machine CPU {old['machine_cpu_s']:.0f} s -> "
             f"{new['machine_cpu_s']:.0f} s{_speed(old)} ->{_speed(new) or ' (none)'}"]
    before = {t["test"]: t for t in old["costliest"]}
    after = {t["test"]: t for t in new["costliest"]}
    for name in sorted(set(before) | set(after), key=lambda n: -max(before.get(n, {"wall_s": 0})["wall_s"],
                                                                      after.get(n, {"wall_s": 0})["wall_s"])):
        a = f"{before[name]['wall_s']:7.1f}" if name in before else "      -"
        b = f"{after[name]['wall_s']:7.1f}" if name in after else "      -"
        lines.append(f"{a} s -> {b} s  {name}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="two ledgers: paths or history positions")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="pytest seconds allowed (default 720)")
    parser.add_argument("--json", action="store_true", help="print the latest ledger as JSON")
    args = parser.parse_args(argv)
    try:
        if args.compare:
            print(compare(load(args.compare[0]), load(args.compare[1])))
            return 0
        doc = load(str(LEDGER_DIR / "latest.json"))
    except (OSError, IndexError, ValueError) as exc:
        print(f"test_budget: no ledger to read ({exc}); run the whole suite first: bash tools/test.sh", file=sys.stderr)
        return 2
    print(json.dumps(doc, indent=1) if args.json else show(doc, args.budget))
    return 0 if doc["pytest_s"] <= args.budget else 1


if __name__ == "__main__":
    sys.exit(main())
