"""The paper's experiments as studies: each one a `Config` (a frozen dataclass of
plain settings, `sinkmech.studies.config.StudyConfig`, defined in
`sinkmech.studies.configs` so that the command line reads it before torch loads),
a `run(model_or_models, config) -> Result` in the study's own module whose result
records the config it ran (`to_dict()["config"]`, so a run can be read back and
repeated), and a command line entry (`sinkmech study NAME`).
"""
