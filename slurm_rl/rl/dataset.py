"""Prompt datasets from files: JSONL or Parquet rows -> chat-templated, tokenized prompts.

A row holds a prompt (column ``data.prompt_key``), usually an answer (``data.answer_key``; ``None``
when absent) and any other columns (kept in :attr:`PromptRow.extra`). A prompt is a string or a
list of chat messages ``{"role": str, "content": str}`` with at least one ``user`` message.

* :func:`read_rows` reads a ``.jsonl`` (one JSON object per line, blank lines skipped) or a
  ``.parquet`` file (row group by row group); a bad line or a corrupt file is a
  :class:`DataFileError` naming the file and the line / row group.
* :func:`check_data_files` reports problems as ``(config key, value, what is allowed)`` without a
  tokenizer, for the config check before anything is launched.
* :meth:`PromptDataset.load` renders the prompts (chat template), batch-tokenizes them and drops
  (or refuses) those longer than ``data.max_prompt_length``.
* :func:`iteration_rows` gives the prompts of an iteration as a pure function of
  ``(rows, seed, iteration, n)``: epochs of seeded permutations, nothing to save but the iteration.

Row numbers are 1-based and name what an editor shows: the *line* of a JSONL file (blank lines
count), the row of a Parquet file. :attr:`PromptRow.source` is ``"FILE:ROW"``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import xxhash

from slurm_rl.errors import InputError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["SUFFIXES", "DataFileError", "DataSpec", "PromptDataset", "PromptRow",
           "check_data_files", "data_position", "iteration_rows", "read_rows", "stream_rows", "val_rows"]

SUFFIXES: tuple[str, ...] = (".jsonl", ".parquet")
OVERLONG: tuple[str, ...] = ("drop", "error")
_TOKENIZE_CHUNK = 4096  # texts per batched tokenizer call


def _issue(key: str, value: Any, allowed: str) -> str:
    """The one-line form of a problem, as the config check prints it."""
    return f"{key}: got {value!r}; allowed: {allowed}"


class DataFileError(InputError):
    """A data file could not be read: missing, unreadable, a bad JSONL line, a corrupt Parquet file.

    ``row`` is the 1-based JSONL line, ``row_group`` the Parquet row group, when known."""

    def __init__(self, path: str, what: str, *, row: int | None = None,
                 row_group: int | None = None) -> None:
        self.path, self.what, self.row, self.row_group = path, what, row, row_group
        where = path
        if row is not None:
            where += f": line {row}"
        if row_group is not None:
            where += f": row group {row_group}"
        super().__init__(f"{where}: {what}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_data_file_error, (self.path, self.what, self.row, self.row_group))


def _rebuild_data_file_error(path: str, what: str, row: int | None,
                             row_group: int | None) -> DataFileError:
    return DataFileError(path, what, row=row, row_group=row_group)


@dataclass(frozen=True)
class DataSpec:
    """The ``data`` section: which files, which columns, how prompts are rendered and filtered.

    ``apply_chat_template=None`` renders string prompts with the chat template when the tokenizer
    has one (chat-message prompts always need it). ``max_prompt_length`` is in tokens;
    ``overlong`` is ``drop`` (count and skip) or ``error``. Lists are stored as tuples."""

    train_files: tuple[str, ...]
    val_files: tuple[str, ...] = ()
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    apply_chat_template: bool | None = None
    max_prompt_length: int | None = None
    overlong: str = "drop"
    shuffle: bool = True

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in ("train_files", "val_files"):
            value = getattr(self, name)
            if isinstance(value, (str, os.PathLike)) or not isinstance(value, Sequence):
                problems.append(_issue(f"data.{name}", value, "a list of .jsonl or .parquet paths"))
                continue
            bad = [f for f in value if not isinstance(f, (str, os.PathLike))]
            if bad:
                problems.append(_issue(f"data.{name}", bad[0], "file paths (strings)"))
                continue
            object.__setattr__(self, name, tuple(os.fspath(f) for f in value))
        for name in ("prompt_key", "answer_key"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                problems.append(_issue(f"data.{name}", getattr(self, name), "a non-empty column name"))
        if self.apply_chat_template is not None and not isinstance(self.apply_chat_template, bool):
            problems.append(_issue("data.apply_chat_template", self.apply_chat_template,
                                   "true, false or null (true when the tokenizer has a chat template)"))
        mpl = self.max_prompt_length
        if mpl is not None and (isinstance(mpl, bool) or not isinstance(mpl, int) or mpl <= 0):
            problems.append(_issue("data.max_prompt_length", mpl, "a positive number of tokens or null"))
        if self.overlong not in OVERLONG:
            problems.append(_issue("data.overlong", self.overlong, " or ".join(OVERLONG)))
        if not isinstance(self.shuffle, bool):
            problems.append(_issue("data.shuffle", self.shuffle, "true or false"))
        if problems:
            raise InputError("\n".join(problems))


@dataclass(frozen=True)
class PromptRow:
    """One prompt, ready for generation.

    ``index`` is the position in the dataset after filtering; ``source`` is ``"FILE:ROW"``;
    ``prompt_text`` is the text after the chat template, ``prompt_ids`` its tokens; ``raw_prompt``
    is the prompt string itself, or the last user message's content for chat messages; ``extra``
    holds every column other than the prompt and the answer."""

    index: int
    source: str
    prompt_text: str
    prompt_ids: tuple[int, ...]
    answer: Any
    extra: dict[str, Any] = field(default_factory=dict)
    raw_prompt: str = ""


# --------------------------------------------------------------------------------------- reading

def _suffix(path: str) -> str:
    return Path(path).suffix.lower()


def read_rows(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows of a ``.jsonl`` or ``.parquet`` file as ``(row, record)``, ``row`` 1-based (the
    line number for JSONL; blank lines are skipped but counted).

    A wrong suffix raises :class:`InputError` at once; a missing file, a line that is not a JSON
    object or a corrupt Parquet file raises :class:`DataFileError` while iterating."""
    path = os.fspath(path)
    suffix = _suffix(path)
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    raise InputError(f"{path}: unsupported data file suffix {suffix or '(none)'!r}; "
                     f"allowed: {', '.join(SUFFIXES)}")


def _read_jsonl(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DataFileError(path, f"cannot open: {exc.strerror or exc}") from exc
    with f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise DataFileError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                                    row=lineno) from exc
            except json.JSONDecodeError as exc:
                raise DataFileError(path, f"not valid JSON ({exc.msg} at column {exc.colno}); "
                                    "expected one JSON object per line", row=lineno) from exc
            if not isinstance(record, dict):
                raise DataFileError(path, f"a JSON {type(record).__name__}, not an object; "
                                    "expected one JSON object per line", row=lineno)
            yield lineno, record


def _read_parquet(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except FileNotFoundError as exc:
        raise DataFileError(path, "no such file") from exc
    except (pa.ArrowException, OSError) as exc:
        raise DataFileError(path, f"not a readable Parquet file ({exc})") from exc
    row = 0
    with pf:
        for group in range(pf.num_row_groups):
            try:
                records = pf.read_row_group(group).to_pylist()
            except (pa.ArrowException, OSError) as exc:
                raise DataFileError(path, f"corrupt Parquet data ({str(exc).strip()})",
                                    row_group=group) from exc
            for record in records:
                row += 1
                yield row, record


# ------------------------------------------------------------------------------------ validating

def _where(path: str, row: int) -> str:
    return f"{'line' if _suffix(path) == '.jsonl' else 'row'} {row} of {path}"


def _describe(value: Any) -> str:
    text = repr(value)
    return f"of type {type(value).__name__} ({text if len(text) <= 40 else text[:37] + '...'})"


def _prompt_problem(prompt: Any) -> str | None:
    """What is wrong with a prompt value, or None: a string, or chat messages with a user turn."""
    if isinstance(prompt, str):
        return None
    if not isinstance(prompt, list):
        return f"the prompt is {_describe(prompt)}"
    if not prompt:
        return "the prompt is an empty message list"
    for i, message in enumerate(prompt):
        if not isinstance(message, dict):
            return f"message {i} is {_describe(message)}, not a {{'role', 'content'}} object"
        for key in ("role", "content"):
            if message.get(key) is None:
                return f"message {i} has no {key!r} (keys {list(message)})"
            if not isinstance(message[key], str):
                return f"the {key!r} of message {i} is {_describe(message[key])}"
    if not any(m["role"] == "user" for m in prompt):
        return f"no message has role 'user' (roles {[m['role'] for m in prompt]})"
    return None


_PROMPT_ALLOWED = "a string or a list of {'role': str, 'content': str} messages with a 'user' message"


_MISSING = object()


def column_value(record: dict[str, Any], key: str) -> Any:
    """``record[key]``, or for a dotted key that is not a column itself (``reward_model.ground_truth``,
    as verl's preprocessing nests the answer) the nested value; ``_MISSING`` when absent."""
    if key in record:
        return record[key]
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _missing_key(record: dict[str, Any], key: str) -> str:
    """What a row has where ``key`` names nothing (to follow "line N of FILE"): its keys, or those of
    the deepest nested mapping reached."""
    value: Any = record
    reached = []
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            break
        value, reached = value[part], [*reached, part]
    if reached and isinstance(value, dict):
        return f": column {'.'.join(reached)!r} has keys {list(value)}"
    if reached:
        return f": column {'.'.join(reached)!r} is a {type(value).__name__}, not a mapping"
    return f" has keys {list(record)}"


def _row_problem(record: dict[str, Any], path: str, row: int, file_key: str,
                 spec: DataSpec) -> tuple[str, Any, str] | None:
    """The first problem of one row as ``(key, value, allowed)``, or None."""
    where = f"{path}:{row}"
    prompt = column_value(record, spec.prompt_key)
    if prompt is _MISSING:
        return (file_key, where, f"rows with a {spec.prompt_key!r} column (data.prompt_key); "
                f"{_where(path, row)}{_missing_key(record, spec.prompt_key)}")
    if "." in spec.answer_key and column_value(record, spec.answer_key) is _MISSING:
        return ("data.answer_key", spec.answer_key, f"a column or a dotted path to a nested value; "
                f"{_where(path, row)}{_missing_key(record, spec.answer_key)}")
    problem = _prompt_problem(prompt)
    if problem is not None:
        return (file_key, where, f"{_PROMPT_ALLOWED} in column {spec.prompt_key!r}; "
                f"{_where(path, row)}: {problem}")
    if isinstance(prompt, list) and spec.apply_chat_template is False:
        return ("data.apply_chat_template", False, f"true or null: the prompt of {_where(path, row)} "
                "is a list of chat messages, which only the chat template renders")
    return None


def _access_problem(path: str, file_key: str) -> tuple[str, Any, str] | None:
    """A wrong suffix, a missing file or a directory, or None."""
    if _suffix(path) not in SUFFIXES:
        return (file_key, path, f"a file ending in {' or '.join(SUFFIXES)}")
    if not os.path.exists(path):
        return (file_key, path, "an existing file (no such file)")
    if not os.path.isfile(path):
        return (file_key, path, "a regular file (not a directory)")
    return None


def _file_problem(path: str, file_key: str, spec: DataSpec) -> tuple[str, Any, str] | None:
    problem = _access_problem(path, file_key)
    if problem is not None:
        return problem
    rows = 0
    try:
        for row, record in read_rows(path):
            rows += 1
            problem = _row_problem(record, path, row, file_key, spec)
            if problem is not None:
                return problem
    except DataFileError as exc:
        return (file_key, path, f"a readable {_suffix(path)} file ({exc})")
    if rows == 0:
        return (file_key, path, "a file with at least one row (it has none)")
    return None


def check_data_files(files: Sequence[str | os.PathLike[str]], key_prefix: str,
                     spec: DataSpec) -> list[tuple[str, Any, str]]:
    """Problems of data files as ``(config key, value, what is allowed)``, without tokenizing.

    ``key_prefix`` names the list (``data.train_files``); a file's key is ``KEY[i]``. Each file
    is read to its end or to its first bad row (one problem per file at most). An empty list is
    not reported here: whether files are required is the caller's rule."""
    problems: list[tuple[str, Any, str]] = []
    for i, path in enumerate(files):
        problem = _file_problem(os.fspath(path), f"{key_prefix}[{i}]", spec)
        if problem is not None:
            problems.append(problem)
    return problems


# --------------------------------------------------------------------------------------- loading

def _fingerprint(files: Sequence[str], spec: DataSpec) -> str:
    """xxh3-64 of the files' names, sizes and mtimes and of the spec."""
    h = xxhash.xxh3_64()
    for path in files:
        st = os.stat(path)
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    h.update(json.dumps(dataclasses.asdict(spec), sort_keys=True).encode())
    return h.hexdigest()


@dataclass
class PromptDataset:
    """Tokenized prompts in file order (``rows[i].index == i``), the number of prompts dropped as
    longer than ``max_prompt_length`` and a fingerprint of the files and the spec."""

    rows: list[PromptRow]
    dropped_overlong: int
    fingerprint: str
    files: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.rows)

    @classmethod
    def load(cls, files: Sequence[str | os.PathLike[str]], spec: DataSpec,
             tokenizer: PreTrainedTokenizerBase, *, key: str = "data.train_files") -> PromptDataset:
        """Read, render and tokenize every row of ``files`` (``spec.train_files`` or
        ``spec.val_files``; ``key`` names that list in errors).

        Raises :class:`InputError` for a bad file or row (naming file and row), chat messages
        without a usable chat template, an overlong prompt under ``overlong: error``, or no prompt
        left after filtering."""
        paths = tuple(os.fspath(f) for f in files)
        if not paths:
            raise InputError(_issue(key, [], "at least one .jsonl or .parquet file"))
        for i, path in enumerate(paths):
            problem = _access_problem(path, f"{key}[{i}]")
            if problem is not None:
                raise InputError(_issue(*problem))
        fingerprint = _fingerprint(paths, spec)

        has_template = bool(getattr(tokenizer, "chat_template", None))
        tok_name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        if spec.apply_chat_template is True and not has_template:
            raise InputError(_issue("data.apply_chat_template", True,
                                    f"false or null: the tokenizer {tok_name!r} has no chat_template"))
        templated = has_template if spec.apply_chat_template is None else spec.apply_chat_template

        sources: list[str] = []
        texts: list[str] = []
        answers: list[Any] = []
        extras: list[dict[str, Any]] = []
        raws: list[str] = []
        skip = (spec.prompt_key, spec.answer_key)
        for i, path in enumerate(paths):
            file_key = f"{key}[{i}]"
            count = 0
            for row, record in read_rows(path):
                count += 1
                problem = _row_problem(record, path, row, file_key, spec)
                if problem is not None:
                    raise InputError(_issue(*problem))
                prompt = column_value(record, spec.prompt_key)
                if isinstance(prompt, list):
                    if not templated:  # apply_chat_template false is a row problem above
                        raise InputError(
                            f"{_where(path, row)}: a prompt of chat messages needs a chat template, "
                            f"and the tokenizer {tok_name!r} has no chat_template; allowed: string "
                            "prompts, or a tokenizer with a chat template")
                    messages = prompt
                    raw = next(m["content"] for m in reversed(prompt) if m["role"] == "user")
                else:
                    messages = [{"role": "user", "content": prompt}] if templated else None
                    raw = prompt
                if messages is None:
                    text = prompt
                else:
                    try:
                        text = tokenizer.apply_chat_template(messages, tokenize=False,
                                                             add_generation_prompt=True)
                    except Exception as exc:  # the template is user code (Jinja, raise_exception)
                        raise InputError(f"{_where(path, row)}: the chat template failed on this "
                                         f"prompt: {type(exc).__name__}: {exc}") from exc
                sources.append(f"{path}:{row}")
                texts.append(text)
                answer = column_value(record, spec.answer_key)
                answers.append(None if answer is _MISSING else answer)
                extras.append({k: v for k, v in record.items() if k not in skip})
                raws.append(raw)
            if count == 0:
                raise InputError(_issue(file_key, path, "a file with at least one row (it has none)"))

        ids: list[list[int]] = []
        for start in range(0, len(texts), _TOKENIZE_CHUNK):
            ids.extend(tokenizer(texts[start:start + _TOKENIZE_CHUNK], add_special_tokens=not templated,
                                 return_attention_mask=False, return_token_type_ids=False)["input_ids"])

        rows: list[PromptRow] = []
        dropped = 0
        limit = spec.max_prompt_length
        for j, text in enumerate(texts):
            if limit is not None and len(ids[j]) > limit:
                if spec.overlong == "error":
                    raise InputError(_issue("data.max_prompt_length", limit, (
                        f"at least every prompt's length: {sources[j]} has {len(ids[j])} tokens "
                        f"(> {limit}); or data.overlong: drop")))
                dropped += 1
                continue
            rows.append(PromptRow(index=len(rows), source=sources[j], prompt_text=text,
                                  prompt_ids=tuple(ids[j]), answer=answers[j], extra=extras[j],
                                  raw_prompt=raws[j]))
        if not rows:
            raise InputError(_issue("data.max_prompt_length", limit, (
                f"a limit that keeps at least one prompt: all {dropped} prompts of {key} are "
                "longer")))
        return cls(rows=rows, dropped_overlong=dropped, fingerprint=fingerprint, files=paths)


# ------------------------------------------------------------------------------------- iterating

def _epoch_order(seed: int, epoch: int, size: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(size)
    return np.random.default_rng([seed, epoch]).permutation(size)


def _check_position(iteration: int, n: int, size: int) -> None:
    for name, value, low in (("iteration", iteration, 0), ("n", n, 1), ("dataset size", size, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise InputError(f"{name}: got {value!r}; allowed: an integer >= {low}")


def iteration_rows(dataset: PromptDataset | Sequence[PromptRow], seed: int, iteration: int, n: int,
                   shuffle: bool) -> list[PromptRow]:
    """The ``n`` prompts of ``iteration``: global positions ``p = iteration*n + j`` in a stream of
    epochs (:func:`stream_rows`).

    A pure function of ``(rows, seed, iteration, n, shuffle)``."""
    rows = dataset.rows if isinstance(dataset, PromptDataset) else dataset
    _check_position(iteration, n, len(rows))
    return stream_rows(rows, seed, iteration * n, n, shuffle)


def stream_rows(dataset: PromptDataset | Sequence[PromptRow], seed: int, start: int, n: int,
                shuffle: bool) -> list[PromptRow]:
    """The ``n`` prompts at stream positions ``start .. start + n - 1``: epoch ``p // len`` visits the
    rows in the order of a permutation drawn from ``numpy.random.default_rng([seed, epoch])`` (file
    order when ``shuffle`` is false). A pure function of ``(rows, seed, start, n, shuffle)``."""
    rows = dataset.rows if isinstance(dataset, PromptDataset) else dataset
    size = len(rows)
    _check_position(start, n, size)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed: got {seed!r}; allowed: an integer >= 0")
    out: list[PromptRow] = []
    pos, end = start, start + n
    while pos < end:
        epoch, offset = divmod(pos, size)
        take = min(end - pos, size - offset)
        order = _epoch_order(int(seed), epoch, size, shuffle)
        out.extend(rows[int(k)] for k in order[offset:offset + take])
        pos += take
    return out


def data_position(iteration: int, n: int, size: int, consumed: int | None = None) -> dict[str, int]:
    """Where ``iteration`` starts in the prompt stream: ``{"epoch", "offset", "consumed"}``
    (``consumed`` prompts before it: ``iteration * n`` unless given, as dynamic sampling draws more;
    ``offset`` of them in its epoch)."""
    _check_position(iteration, n, size)
    consumed = iteration * n if consumed is None else consumed
    return {"epoch": consumed // size, "offset": consumed % size, "consumed": consumed}


def val_rows(dataset: PromptDataset) -> list[PromptRow]:
    """Every row in file order (for evaluation)."""
    return list(dataset.rows)
