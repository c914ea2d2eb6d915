"""Small from-scratch training runs where sinks can form (Barbero et al. 2025,
Sec. 5; Gu et al. 2025): configuration, data streams and the training loop."""
