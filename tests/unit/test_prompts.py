"""Reading prompts and cutting them to tokens (sinkmech.prompts): file formats,
clear errors for what is not a prompt file, the context cut, and <bos> never doubled."""

from __future__ import annotations

import json

import pytest

from helpers.tiny import TINY_BOS
from sinkmech.corpora import load_prompts
from sinkmech.prompts import tokenize
from helpers.tiny import TINY_RUN
from sinkmech.options import QUIET


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


def test_tokenize_records_the_context_only_where_it_cut(tiny_model):
    long = list(range(2, 40)) * 3  # 114 content tokens; the tiny model holds 64 positions
    for bos in ("prepend", "none"):
        cut = tokenize(tiny_model, [long, [5, 6]], bos=bos, max_tokens=1000, bos_token_id=TINY_BOS)
        assert cut.context_limit == 64 and cut.max_content == 63 and cut.content()[0] == long[:63]
        assert cut.used(1000) == {"max_tokens": 63, "max_tokens_requested": 1000, "content_lengths": [63, 2],
                                  "context_limit": 64}
        asked = tokenize(tiny_model, [long], bos=bos, max_tokens=50, bos_token_id=TINY_BOS)
        assert asked.context_limit is None and asked.max_content == 50  # max_tokens cut it, not the context


def test_tokens_that_already_start_with_bos_are_refused_not_doubled(tiny_model, tiny_tokens):
    import torch

    from sinkmech.measures.sinks import sink_scores

    with_bos = torch.cat([torch.full((len(tiny_tokens), 1), TINY_BOS), tiny_tokens], dim=1)
    for bos in (None, "prepend"):  # the default for prompts is "prepend"
        with pytest.raises(ValueError, match=r"prompt 0 \(and 5 more\) already starts with <bos> \(id 1\).*bos='none'"):
            sink_scores(tiny_model, with_bos, bos=bos, options=TINY_RUN)
    mixed = with_bos.clone()
    mixed[:3, 0] = 7  # only rows 3..5 carry <bos>
    with pytest.raises(ValueError, match=r"prompt 3 \(and 2 more\)"):
        sink_scores(tiny_model, mixed, options=TINY_RUN)
    # bos="none" takes them as given: exactly the sequences "prepend" builds from the content.
    given = sink_scores(tiny_model, with_bos, bos="none", options=QUIET)
    built = sink_scores(tiny_model, tiny_tokens, bos="prepend", options=TINY_RUN)
    assert torch.equal(given.scores, built.scores)


def test_named_corpora_record_each_windows_document():
    """The default corpus is the pydoc windows as before (the old formula, written
    out), and every window's first words come from the document it names."""
    import re

    from pydoc_data.topics import topics

    from sinkmech.corpora import DOMAINS, corpus
    from sinkmech.corpora import default_corpus, load_prompts

    text = " ".join(topics[k] for k in sorted(topics))
    words = re.sub(r"\s+", " ", text).split(" ")
    span = len(words) - 72
    assert default_corpus(40) == [" ".join(words[s : s + 72]) for s in (i * span // 40 for i in range(40))]
    pydoc = corpus("pydoc", 40)
    assert list(pydoc.prompts) == default_corpus(40) and len(pydoc.documents) == 40
    for prompt, doc in zip(pydoc.prompts, pydoc.documents):
        assert " ".join(prompt.split()[:5]) in re.sub(r"\s+", " ", topics[doc])
    # windows share documents: a cluster bootstrap resamples these
    assert pydoc.n_documents == len(set(pydoc.documents)) < 40
    assert pydoc.part(0, 10).documents == pydoc.documents[:10]
    assert DOMAINS == ("pydoc", "licenses")
    lic = corpus("licenses", 40)
    assert lic.n_documents > 10 and not set(lic.prompts) & set(pydoc.prompts)
    assert all(".dist-info/" in d for d in lic.documents)
    assert load_prompts("licenses") == list(corpus("licenses").prompts)
    assert lic.to_dict()["n_documents"] == lic.n_documents and len(lic.sha256) == 64
    with pytest.raises(ValueError, match="domain must be one of"):
        corpus("novels")
