"""Every study's settings, one `Config` class each, registered by name in
`STUDIES`. Imports nothing heavy: the command line checks a config (flags or a
file) before torch loads. Each class names the function that runs it
(`runner`, "module:function", imported only when the study runs).
"""

from __future__ import annotations

from sinkmech.studies.config import StudyConfig

STUDIES: dict[str, type[StudyConfig]] = {}


def register(cls: type[StudyConfig]) -> type[StudyConfig]:
    """Class decorator: add a study's Config to `STUDIES` under its `study` name."""
    if not cls.study or not cls.runner:
        raise TypeError(f"{cls.__name__} needs a `study` name and a `runner`")
    if cls.study in STUDIES:
        raise TypeError(f"two studies are named {cls.study!r}")
    STUDIES[cls.study] = cls
    return cls
