"""The no-op check's first look: how many heads and held-out prompts a quick
run checks by default, how many the findings check, and the note that says
what a first look left out and what the whole check would take. No torch:
the command line reads these while it builds its flags."""

from __future__ import annotations

NOOP_PROMPTS = 8  # held-out prompts a first look checks (when the corpus has room)
NOOP_MAX_HEADS = 4  # ... on at most this many heads, the if-else heads first
FULL_NOOP_PROMPTS = 64  # held-out prompts the findings check on (`make findings`)


def first_look_note(n_checked: int, n_covered: int, n_prompts: int, seconds: float, *,
                    all_heads: str = "all") -> str | None:
    """The note after a no-op check of `n_checked` of the `n_covered` heads it
    covers on `n_prompts` held-out prompts in `seconds`: what it left out and
    about how long the whole check (every head, FULL_NOOP_PROMPTS prompts or
    more) takes at this speed, the flags that ask for it included. None when
    the check was already whole. `all_heads` is how the command spells "no cap"."""
    if n_checked < 1 or n_prompts < 1 or (n_checked >= n_covered and n_prompts >= FULL_NOOP_PROMPTS):
        return None
    full = max(FULL_NOOP_PROMPTS, n_prompts)
    minutes = seconds / 60 * max(n_covered, n_checked) / n_checked * full / n_prompts
    return (f"note: the no-op check ran on {n_checked} of the {n_covered} heads it covers (every if-else head, then "
            f"the closest candidates) and {n_prompts} held-out prompts: a first look (wide intervals); "
            f"--noop-max-heads {all_heads} --noop-prompts {full} checks every one on {full} prompts (about "
            f"{max(minutes, 1):.0f} min at this speed)")
