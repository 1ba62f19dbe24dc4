"""Prompt datasets from JSONL/Parquet files: reading, checking, templating, tokenizing, filtering,
and the seeded epoch order of :func:`slurm_rl.rl.dataset.iteration_rows`.

The tokenizer is built here (character-level WordLevel over printable ASCII, no hub): every
character is one token, so token counts are character counts (+1 for ``<bos>``)."""

from __future__ import annotations

import json
import os
import pickle
import string
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slurm_rl.errors import InputError
from slurm_rl.rl.dataset import (DataFileError, DataSpec, PromptDataset, check_data_files,
                                 data_position, iteration_rows, read_rows, val_rows)

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
PAD, BOS, EOS, UNK = range(4)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def _make_tokenizer(chat_template: str | None) -> Any:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>", chat_template=chat_template,
                                   model_max_length=1 << 20)


@pytest.fixture(scope="module")
def plain_tok() -> Any:
    return _make_tokenizer(None)


@pytest.fixture(scope="module")
def chat_tok() -> Any:
    return _make_tokenizer(CHAT_TEMPLATE)


def write_jsonl(path: Path, rows: list[Any], raw_lines: dict[int, str] | None = None) -> str:
    """Rows as JSON lines; ``raw_lines`` replaces line ``i`` (0-based) by a literal string."""
    lines = [json.dumps(r) for r in rows]
    for i, text in (raw_lines or {}).items():
        lines[i] = text
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def write_parquet(path: Path, rows: list[dict[str, Any]], row_group_size: int | None = None) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return str(path)


def spec_for(*files: str, **kw: Any) -> DataSpec:
    return DataSpec(train_files=tuple(files), **kw)


def problem_text(problems: list[tuple[str, Any, str]]) -> str:
    return "\n".join(f"{k}: got {v!r}; allowed: {a}" for k, v, a in problems)


def _ids(tok: Any, text: str, special: bool) -> tuple[int, ...]:
    return tuple(tok(text, add_special_tokens=special)["input_ids"])


# ----------------------------------------------------------------------------------- prompts

def test_string_prompts_raw_keep_answer_and_extra(tmp_path: Path, plain_tok: Any) -> None:
    rows = [{"prompt": "1+2=", "answer": "3", "id": 7, "level": "easy"},
            {"prompt": "what is 2*3?", "answer": 6, "meta": {"k": [1, 2]}}]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    ds = PromptDataset.load([path], spec_for(path), plain_tok)
    assert ds.dropped_overlong == 0 and len(ds) == 2
    first, second = ds.rows
    assert (first.index, first.source) == (0, f"{path}:1")
    assert first.prompt_text == first.raw_prompt == "1+2="
    assert first.prompt_ids == (BOS,) + _ids(plain_tok, "1+2=", False)  # the post-processor's BOS
    assert (first.answer, first.extra) == ("3", {"id": 7, "level": "easy"})
    assert (second.index, second.answer, second.extra) == (1, 6, {"meta": {"k": [1, 2]}})
    assert val_rows(ds) == ds.rows


def test_string_prompts_templated_when_tokenizer_has_template(tmp_path: Path, chat_tok: Any) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "hi there", "answer": 1}])
    row = PromptDataset.load([path], spec_for(path), chat_tok).rows[0]
    assert row.prompt_text == "<bos>user: hi there\nassistant: "
    assert row.raw_prompt == "hi there"
    assert row.prompt_ids[0] == BOS and row.prompt_ids.count(BOS) == 1  # template's BOS, no second
    assert row.prompt_ids == _ids(chat_tok, row.prompt_text, False)
    # apply_chat_template false: the string as is, with the tokenizer's own BOS
    raw = PromptDataset.load([path], spec_for(path, apply_chat_template=False), chat_tok).rows[0]
    assert raw.prompt_text == "hi there" and raw.prompt_ids == (BOS,) + _ids(chat_tok, "hi there", False)


def test_chat_messages_parquet(tmp_path: Path, chat_tok: Any) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q1"},
                {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    path = write_parquet(tmp_path / "chat.parquet",
                         [{"prompt": messages, "answer": "42", "split": "train"},
                          {"prompt": [{"role": "user", "content": "only"}], "answer": "1", "split": "x"}])
    ds = PromptDataset.load([path], spec_for(path), chat_tok)
    row = ds.rows[0]
    assert row.prompt_text == "<bos>system: be brief\nuser: q1\nassistant: a1\nuser: q2\nassistant: "
    assert row.raw_prompt == "q2" and row.answer == "42" and row.extra == {"split": "train"}
    assert (row.source, ds.rows[1].source) == (f"{path}:1", f"{path}:2")
    assert ds.rows[1].raw_prompt == "only"


def test_chat_messages_need_a_template(tmp_path: Path, plain_tok: Any, chat_tok: Any) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "plain"},
                                              {"prompt": [{"role": "user", "content": "x"}]}])
    with pytest.raises(InputError, match=r"line 2 of .*m\.jsonl.*no chat_template"):
        PromptDataset.load([path], spec_for(path), plain_tok)
    with pytest.raises(InputError, match=r"data\.apply_chat_template: got False.*line 2 of .*m\.jsonl"):
        PromptDataset.load([path], spec_for(path, apply_chat_template=False), chat_tok)
    only_str = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "plain"}])
    with pytest.raises(InputError, match=r"data\.apply_chat_template: got True.*no chat_template"):
        PromptDataset.load([only_str], spec_for(only_str, apply_chat_template=True), plain_tok)


def test_template_failure_names_row(tmp_path: Path) -> None:
    tok = _make_tokenizer("{% if messages[0]['role'] != 'system' %}"
                          "{{ raise_exception('system first') }}{% endif %}x")
    path = write_jsonl(tmp_path / "r.jsonl", [{"prompt": "a"}])
    with pytest.raises(InputError, match=r"line 1 of .*r\.jsonl.*system first"):
        PromptDataset.load([path], spec_for(path), tok)


def test_several_files_in_order(tmp_path: Path, plain_tok: Any) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "a1"}, {"prompt": "a2"}])
    b = write_parquet(tmp_path / "b.parquet", [{"prompt": "b1"}])
    ds = PromptDataset.load([a, b], spec_for(a, b), plain_tok)
    assert [(r.index, r.raw_prompt, r.answer) for r in ds.rows] == [(0, "a1", None), (1, "a2", None),
                                                                   (2, "b1", None)]


# -------------------------------------------------------------------------------- overlong

def test_overlong_dropped_and_counted(tmp_path: Path, plain_tok: Any) -> None:
    # char-level: a prompt of k characters is k+1 tokens with <bos>
    path = write_jsonl(tmp_path / "o.jsonl", [{"prompt": "x" * k, "answer": k} for k in (3, 9, 4, 12, 5)])
    ds = PromptDataset.load([path], spec_for(path, max_prompt_length=6), plain_tok)
    assert ds.dropped_overlong == 2
    assert [(r.index, r.answer, r.source) for r in ds.rows] == [
        (0, 3, f"{path}:1"), (1, 4, f"{path}:3"), (2, 5, f"{path}:5")]
    assert all(len(r.prompt_ids) <= 6 for r in ds.rows)


def test_overlong_error_and_nothing_left(tmp_path: Path, plain_tok: Any) -> None:
    path = write_jsonl(tmp_path / "o.jsonl", [{"prompt": "ab"}, {"prompt": "x" * 9}])
    with pytest.raises(InputError) as err:
        PromptDataset.load([path], spec_for(path, max_prompt_length=6, overlong="error"), plain_tok)
    assert "data.max_prompt_length: got 6" in str(err.value)
    assert f"{path}:2 has 10 tokens" in str(err.value)
    with pytest.raises(InputError, match=r"data\.max_prompt_length: got 1;.*all 2 prompts"):
        PromptDataset.load([path], spec_for(path, max_prompt_length=1), plain_tok)


# ------------------------------------------------------------------------------- iteration

def _rows(n: int) -> list[Any]:
    return list(range(n))  # iteration_rows only indexes the rows


def test_iteration_rows_epochs_cover_each_row_once() -> None:
    rows, n = _rows(7), 3
    stream = [r for it in range(7) for r in iteration_rows(rows, 5, it, n, True)]  # 21 = 3 epochs
    epochs = [stream[i:i + 7] for i in range(0, 21, 7)]
    assert all(sorted(e) == rows for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3  # each epoch its own order
    assert iteration_rows(rows, 5, 3, n, True) == stream[9:12]  # computed alone, mid-epoch boundary
    assert iteration_rows(rows, 5, 3, n, True) == iteration_rows(rows, 5, 3, n, True)
    assert data_position(3, n, 7) == {"epoch": 1, "offset": 2, "consumed": 9}
    assert data_position(0, n, 7) == {"epoch": 0, "offset": 0, "consumed": 0}


def test_iteration_rows_seeds_shuffle_and_large_n() -> None:
    rows = _rows(50)
    assert iteration_rows(rows, 1, 0, 50, True) != iteration_rows(rows, 2, 0, 50, True)
    assert iteration_rows(rows, 1, 0, 50, False) == rows
    assert iteration_rows(rows, 1, 1, 20, False) == rows[20:40]
    big = iteration_rows(rows, 3, 0, 120, True)  # n larger than the dataset: 2.4 epochs
    assert sorted(big[:50]) == rows and sorted(big[50:100]) == rows and len(set(big[100:])) == 20
    assert big[50:] == [r for it in (5, 6, 7, 8, 9, 10, 11) for r in iteration_rows(rows, 3, it, 10, True)]
    for bad in ({"n": 0}, {"iteration": -1}, {"seed": -1}):
        args = {"seed": 1, "iteration": 0, "n": 2} | bad
        with pytest.raises(InputError, match=next(iter(bad))):
            iteration_rows(rows, args["seed"], args["iteration"], args["n"], True)
    with pytest.raises(InputError, match="dataset size"):
        iteration_rows([], 1, 0, 1, True)


def test_iteration_rows_of_a_dataset(tmp_path: Path, plain_tok: Any) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(6)])
    ds = PromptDataset.load([path], spec_for(path), plain_tok)
    got = iteration_rows(ds, 0, 1, 4, True)
    assert len(got) == 4 and all(r is ds.rows[r.index] for r in got)


# --------------------------------------------------------------------------------- reading

def test_read_rows_jsonl_lines_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text('{"prompt": "a"}\n\n   \n{"prompt": "b"}\n')
    assert list(read_rows(path)) == [(1, {"prompt": "a"}), (4, {"prompt": "b"})]


def test_read_rows_corrupt_jsonl_line_named(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [{"prompt": str(i)} for i in range(5)],
                       raw_lines={2: '{"prompt": "oops"'})
    it = read_rows(path)
    assert [row for row, _ in (next(it), next(it))] == [1, 2]
    with pytest.raises(DataFileError, match=r"c\.jsonl: line 3: not valid JSON") as err:
        next(it)
    assert err.value.row == 3 and isinstance(err.value, InputError)
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)
    not_object = write_jsonl(tmp_path / "n.jsonl", [{"prompt": "a"}, [1, 2]])
    with pytest.raises(DataFileError, match=r"n\.jsonl: line 2: a JSON list, not an object"):
        list(read_rows(not_object))


def test_read_rows_suffix_and_parquet_groups(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"data\.csv.*'\.csv'.*\.jsonl, \.parquet"):
        read_rows(tmp_path / "data.csv")
    path = write_parquet(tmp_path / "g.parquet", [{"prompt": f"p{i}"} for i in range(10)], row_group_size=3)
    assert pq.ParquetFile(path).num_row_groups == 4
    assert [(row, rec["prompt"]) for row, rec in read_rows(path)] == [(i + 1, f"p{i}") for i in range(10)]


def test_corrupt_parquet_names_file_and_row_group(tmp_path: Path) -> None:
    good = write_parquet(tmp_path / "good.parquet", [{"prompt": f"question {i} " * 10} for i in range(40)],
                         row_group_size=10)
    data = Path(good).read_bytes()
    truncated = tmp_path / "trunc.parquet"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFileError, match=r"trunc\.parquet: not a readable Parquet file"):
        list(read_rows(truncated))
    column = pq.ParquetFile(good).metadata.row_group(2).column(0)
    start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    damaged = bytearray(data)
    damaged[start:start + 16] = bytes(16)  # the page header of row group 2
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(damaged))
    with pytest.raises(DataFileError, match=r"bad\.parquet: row group 2: corrupt Parquet data") as err:
        list(read_rows(bad))
    assert err.value.row_group == 2


# -------------------------------------------------------------------------------- checking

def test_check_data_files_good(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "x"}, {"prompt": [{"role": "user", "content": "y"}]}])
    b = write_parquet(tmp_path / "b.parquet", [{"prompt": "z", "answer": 1}])
    assert check_data_files([a, b], "data.train_files", spec_for(a, b)) == []
    assert check_data_files([], "data.val_files", spec_for(a)) == []


def test_check_data_files_every_problem(tmp_path: Path) -> None:
    empty_pq = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), empty_pq)
    (tmp_path / "adir.jsonl").mkdir()
    files = [
        str(tmp_path / "missing.jsonl"),                                                       # 0
        write_jsonl(tmp_path / "data.csv", [{"prompt": "x"}]),                                 # 1
        write_jsonl(tmp_path / "nokey.jsonl", [{"prompt": "ok"}, {"question": "q", "answer": 1}]),  # 2
        write_jsonl(tmp_path / "type.jsonl", [{"prompt": 5}, {"prompt": None}]),               # 3
        write_parquet(tmp_path / "msg.parquet", [{"prompt": [{"role": "user", "text": "q"}]}]),  # 4
        write_jsonl(tmp_path / "empty.jsonl", []),                                             # 5
        str(empty_pq),                                                                         # 6
        write_jsonl(tmp_path / "corrupt.jsonl", [{"prompt": "a"}] * 4, raw_lines={2: "{nope"}),  # 7
        write_jsonl(tmp_path / "roles.jsonl", [{"prompt": [{"role": "system", "content": "s"}]}]),  # 8
        str(tmp_path / "adir.jsonl"),                                                          # 9
        write_jsonl(tmp_path / "nomsgs.jsonl", [{"prompt": []}]),                              # 10
    ]
    (tmp_path / "junk.parquet").write_bytes(b"not a parquet file at all")
    files.append(str(tmp_path / "junk.parquet"))                                               # 11
    problems = check_data_files(files, "data.train_files", spec_for(*files))
    by_key = {k: (v, a) for k, v, a in problems}
    assert sorted(by_key, key=lambda k: int(k.split("[")[1][:-1])) == [
        f"data.train_files[{i}]" for i in range(12)]  # one problem per file
    assert by_key["data.train_files[0]"] == (files[0], "an existing file (no such file)")
    assert by_key["data.train_files[1]"] == (files[1], "a file ending in .jsonl or .parquet")
    value, allowed = by_key["data.train_files[2]"]
    assert value == f"{files[2]}:2"
    assert "'prompt' column (data.prompt_key)" in allowed
    assert f"line 2 of {files[2]} has keys ['question', 'answer']" in allowed
    value, allowed = by_key["data.train_files[3]"]  # stops at the first bad row of the file
    assert value == f"{files[3]}:1" and f"line 1 of {files[3]}: the prompt is of type int (5)" in allowed
    value, allowed = by_key["data.train_files[4]"]
    assert value == f"{files[4]}:1" and "message 0 has no 'content'" in allowed
    assert f"row 1 of {files[4]}" in allowed and "'role', 'text'" in allowed
    assert by_key["data.train_files[5]"] == (files[5], "a file with at least one row (it has none)")
    assert by_key["data.train_files[6]"] == (files[6], "a file with at least one row (it has none)")
    value, allowed = by_key["data.train_files[7]"]
    assert value == files[7] and f"{files[7]}: line 3: not valid JSON" in allowed
    assert "no message has role 'user' (roles ['system'])" in by_key["data.train_files[8]"][1]
    assert by_key["data.train_files[9]"] == (files[9], "a regular file (not a directory)")
    assert "an empty message list" in by_key["data.train_files[10]"][1]
    value, allowed = by_key["data.train_files[11]"]
    assert value == files[11] and f"{files[11]}: not a readable Parquet file" in allowed
    assert "data.train_files[2]: got " in problem_text(problems)


def test_check_data_files_prompt_key_and_chat_off(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "x", "answer": "1"}])
    assert check_data_files([path], "data.val_files", spec_for(path, prompt_key="question")) == []
    [(key, value, allowed)] = check_data_files([path], "data.val_files", spec_for(path))
    assert key == "data.val_files[0]" and "has keys ['question', 'answer']" in allowed
    chat = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "s"}, {"prompt": [{"role": "user", "content": "m"}]}])
    [(key, value, allowed)] = check_data_files([chat], "data.train_files",
                                               spec_for(chat, apply_chat_template=False))
    assert (key, value) == ("data.apply_chat_template", False) and f"line 2 of {chat}" in allowed


def test_load_refuses_bad_files(tmp_path: Path, plain_tok: Any) -> None:
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(InputError, match=r"data\.val_files\[0\]: got '.*nope\.jsonl'.*no such file"):
        PromptDataset.load([missing], spec_for(missing), plain_tok, key="data.val_files")
    with pytest.raises(InputError, match=r"data\.train_files: got \[\]"):
        PromptDataset.load([], spec_for(), plain_tok)
    nokey = write_jsonl(tmp_path / "k.jsonl", [{"prompt": "a"}, {"q": "b"}])
    with pytest.raises(InputError, match=r"line 2 of .*k\.jsonl has keys \['q'\]"):
        PromptDataset.load([nokey], spec_for(nokey), plain_tok)
    corrupt = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "a"}] * 3, raw_lines={1: "]"})
    with pytest.raises(DataFileError, match=r"c\.jsonl: line 2"):
        PromptDataset.load([corrupt], spec_for(corrupt), plain_tok)


# ---------------------------------------------------------------------------- spec, fingerprint

def test_spec_validation() -> None:
    spec = DataSpec(train_files=["a.jsonl"], val_files=[Path("b.parquet")])  # type: ignore[arg-type]
    assert spec.train_files == ("a.jsonl",) and spec.val_files == ("b.parquet",)
    with pytest.raises(InputError) as err:
        DataSpec(train_files=("a.jsonl",), overlong="truncate", max_prompt_length=0)
    assert "data.overlong: got 'truncate'; allowed: drop or error" in str(err.value)
    assert "data.max_prompt_length: got 0" in str(err.value)
    with pytest.raises(InputError, match="data.train_files"):
        DataSpec(train_files="a.jsonl")  # type: ignore[arg-type]


def test_fingerprint_follows_files_and_spec(tmp_path: Path, plain_tok: Any) -> None:
    path = write_jsonl(tmp_path / "f.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    spec = spec_for(path)
    first = PromptDataset.load([path], spec, plain_tok).fingerprint
    assert PromptDataset.load([path], spec, plain_tok).fingerprint == first
    assert PromptDataset.load([path], spec_for(path, shuffle=False), plain_tok).fingerprint != first
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert PromptDataset.load([path], spec, plain_tok).fingerprint != first
