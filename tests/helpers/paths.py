"""Where the tests find the repository."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # the tests folder (conftest.py and helpers/ sit here)
REPO = TESTS.parent  # the repository root (scripts/, figures/, docs/)
