"""The paper's experiments as studies: each one a `Config` (a frozen dataclass of
plain settings, `sinkmech.studies.config.StudyConfig`), a
`run(model_or_models, config) -> Result` whose result records the config it ran
(`to_dict()["config"]`, so a run can be read back and repeated), and a command
line entry (`sinkmech study NAME`). `STUDIES` names each study's module; the
module defines `Config` and `run`.
"""
