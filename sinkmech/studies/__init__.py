"""The paper's experiments as studies. Each study is three things:

- a `Config`: a frozen dataclass of plain settings (`sinkmech.studies.config.StudyConfig`:
  JSON-typed fields, each with a default, so `Config()` is the study as the findings
  quote it; `help` for its flags; cross-field checks in `check`), defined and
  `@register`ed in `sinkmech.studies.configs`, which imports nothing heavy, so the
  command line checks a config before torch loads;
- `run(model_or_models, config, options=RunOptions()) -> Result` in the study's own
  module (named by the Config's `runner`), whose result records the config it ran
  (`to_dict()["config"] == config.to_dict()`), so a run can be read back
  (`Config.read(result.json)`) and repeated;
- the command line entry `sinkmech study NAME [--config FILE] [--FIELD VALUE ...]`
  (`sinkmech.cli.study`: one flag per field, made from the Config), for every
  registered Config.

What the command line hands `run` as `model_or_models`: the loaded model when the
Config has a `model` field (loaded with the options' device and dtype); the list of
specs when it has `models` (load them one at a time with
`sinkmech.loading.models.each_model`); None otherwise (the study trains or loads its
own). From Python: `config.run(models, options)`, or the module's `run` itself.
"""
