"""Prompt files of the toy tasks the cpu tests train on (written by ``slurm_rl.toy.tasks``):
``add_4.jsonl`` (``"3+4="`` -> ``"#### 7"``, reward ``gsm8k``) and ``copy_6.jsonl`` (six letters
from ``a-f``, reward ``exact``), 256 rows each. Regenerate with
``python -c "from slurm_rl.toy.tasks import write_task_dataset; ..."`` (see tests/data/README)."""

from pathlib import Path

TOY_DATA = Path(__file__).resolve().parent / "data"
