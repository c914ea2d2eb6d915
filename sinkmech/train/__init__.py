"""Small from-scratch training runs where sinks can form (Barbero et al. 2025,
Sec. 5; Gu et al. 2025): configuration, data streams and the training loop
(`config`, `data`, `model`, `run`, `evaluate`, `modes`, `emergence`); and the
studies built on them (`presets`, `parallel`, `summary`, `studies`, `readouts`,
`findings`), run as `sinkmech train study NAME`."""
