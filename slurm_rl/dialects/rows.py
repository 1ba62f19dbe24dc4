"""How many rows the training files hold (epochs -> iterations), read from file metadata only."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def dataset_rows(files: Sequence[str]) -> tuple[int | None, str]:
    """The rows of every file together (parquet: its footer; jsonl: its non-empty lines), or (None, why not)."""
    total = 0
    if not files:
        return None, "none given"
    for name in files:
        path = Path(name).expanduser()
        if not path.is_file():
            return None, f"{name}: no such file"
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            try:
                total += pq.ParquetFile(path).metadata.num_rows
            except Exception as exc:  # noqa: BLE001  (pyarrow raises several kinds on a broken file)
                return None, f"{name}: not a parquet file ({exc})"
        else:
            with path.open("rb") as f:
                total += sum(1 for line in f if line.strip())
    return total, ""
