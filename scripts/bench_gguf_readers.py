"""Why sinkmech keeps its own llama-family GGUF dequantizer (`sinkmech.loading.gguf`)
on TransformerLens 3.9: it against the general path, side by side in one run.

Own: GGUF -> `read_gguf` -> HookedTransformer. General: transformers' GGUF
reader -> a Hugging Face folder -> HookedTransformer (`loading.hooked.
hooked_from_hf_folder`), the path every other architecture takes. Prints the
cold conversion time of each, their ratio, and how far apart the two models'
tokens, logits, log-probabilities and first-token attention are on 16 prompts
of the default corpus. (Warm loads come from the model cache either way.)

    python scripts/bench_gguf_readers.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from sinkmech.loading.bridge import read_gguf_transformers, save_hf_folder
from sinkmech.loading.hooked import _llama_from_gguf, hooked_from_hf_folder
from sinkmech.loading.models import smollm2_path
from sinkmech.corpora import default_corpus


def main() -> None:
    torch.set_grad_enabled(False)
    path = smollm2_path()
    t0 = time.perf_counter()
    own = _llama_from_gguf(path, 2048)
    t_own = time.perf_counter() - t0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        hf, tok = read_gguf_transformers(path)
        save_hf_folder(hf, tok, Path(tmp) / "smollm2")
        del hf
        general = hooked_from_hf_folder(Path(tmp) / "smollm2", 2048)
    t_general = time.perf_counter() - t0
    texts = default_corpus()[:16]
    ids = [[own.tokenizer(x, add_special_tokens=False)["input_ids"] for x in texts],
           [general.tokenizer(x, add_special_tokens=False)["input_ids"] for x in texts]]
    logit = logprob = alpha0 = 0.0
    pattern = lambda name: name.endswith("hook_pattern")  # noqa: E731
    for row in ids[0]:
        x = torch.tensor([[own.tokenizer.bos_token_id] + row[:63]])
        (la, ca), (lb, cb) = own.run_with_cache(x, names_filter=pattern), general.run_with_cache(x, names_filter=pattern)
        logit = max(logit, (la - lb).abs().max().item())
        logprob = max(logprob, (la.log_softmax(-1) - lb.log_softmax(-1)).abs().max().item())
        alpha0 = max(alpha0, max((ca[k][..., 0] - cb[k][..., 0]).abs().max().item() for k in ca.keys()))
    print(f"SmolLM2-135M cold conversion: own dequantizer {t_own:.1f} s, transformers' reader + folder "
          f"{t_general:.1f} s: {t_general / t_own:.2f}x")
    print(f"same token ids: {ids[0] == ids[1]}; max |logit diff| {logit:.2e}, max |log-prob diff| {logprob:.2e}, "
          f"max |alpha_0 diff| {alpha0:.2e}")


if __name__ == "__main__":
    main()
