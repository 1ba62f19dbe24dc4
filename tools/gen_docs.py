"""Write the generated parts of the docs: the config reference (every key of the typed config with its type,
default and meaning) and the key tables of verl's and RLinf's dialects, between each file's generated markers.

    python tools/gen_docs.py           # rewrite them
    python tools/gen_docs.py --check   # exit 1 when a file is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slurm_rl.config_docs import config_reference, dialect_table, splice

REPO = Path(__file__).resolve().parents[1]


def generated() -> dict[Path, str]:
    """Each docs file with its generated part as the code says it is now."""
    parts = {"docs/config-reference.md": config_reference(), "docs/coming-from-verl.md": dialect_table("verl"),
             "docs/coming-from-rlinf.md": dialect_table("rlinf")}
    return {REPO / name: splice((REPO / name).read_text(), text) for name, text in parts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is out of date (write nothing)")
    args = parser.parse_args(argv)
    stale = [path for path, text in generated().items() if path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"out of date: {path.relative_to(REPO)} (python tools/gen_docs.py)")
        return 1 if stale else 0
    for path, text in generated().items():
        path.write_text(text)
    print(f"wrote {len(stale)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
