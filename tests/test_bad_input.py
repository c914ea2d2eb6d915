"""Bad input fails fast and clearly (prompt files, short prompts)."""

from __future__ import annotations

import json

import pytest

from conftest import TINY_BOS
from sinkmech.prompts import load_prompts, tokenize


@pytest.mark.parametrize("name", ["p.JSONL", "p.ndjson", "p.jsonl"])
def test_jsonl_suffixes_in_any_case_read_the_text_field(tmp_path, name):
    f = tmp_path / name
    f.write_text('{"text": "first prompt"}\n{"text": "second"}\n')
    assert load_prompts(str(f)) == ["first prompt", "second"]


def test_json_file_reads_a_list_of_strings_or_objects(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(["a b", {"text": "c d"}]))
    assert load_prompts(str(f)) == ["a b", "c d"]
    f.write_text('{"text": "one"}\n{"text": "two"}\n')  # JSON lines under .json: read their text, braces never leak
    assert load_prompts(str(f)) == ["one", "two"]
    f.write_text('{"prompts": ["x"]}')
    with pytest.raises(ValueError, match="list of strings"):
        load_prompts(str(f))


def test_json_lines_in_a_text_file_are_an_error_not_prompts_with_braces(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text('{"text": "first"}\n{"text": "second"}\n')
    with pytest.raises(ValueError, match="looks like JSON lines"):
        load_prompts(str(f))


def test_missing_file_and_directory_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found: nope"):
        load_prompts("nope")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        load_prompts(str(tmp_path))
    with pytest.raises(ValueError, match="ambiguous"):
        load_prompts("the quick brown fox")


def test_binary_file_names_the_file_and_offset(tmp_path):
    f = tmp_path / "prog"
    f.write_bytes(b"ELF\x7f\x00\x01\xff\xfe")
    with pytest.raises(ValueError, match=r"prog.*byte 6"):
        load_prompts(str(f))
    g = tmp_path / "nul.txt"
    g.write_bytes(b"abc\x00def")
    with pytest.raises(ValueError, match=r"nul.txt.*offset 3"):
        load_prompts(str(g))


def test_one_token_prompts_are_an_error(tiny_model):
    with pytest.raises(ValueError, match="1 content token"):
        tokenize(tiny_model, [[5, 6, 7], [9]], bos="none", max_tokens=8, bos_token_id=TINY_BOS)
    batch = tokenize(tiny_model, [[5, 6, 7], [9, 4]], bos="prepend", max_tokens=8, bos_token_id=TINY_BOS)
    assert batch.lengths.tolist() == [4, 3]  # shorter than max_tokens: kept at their own length
