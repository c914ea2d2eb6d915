"""Static matplotlib figures for write-ups (PNG, SVG, PDF), one module per topic.

`core` holds what every figure shares (saving, heatmap panels, shared colour
limits, lines over layers); each topic module draws one kind of result:
`sinks` (first-token scores, sink rates), `perturb` (perturbation spread),
`heads` (value and output norms, query/key norm bands of chosen heads),
`patching` (patching and ablation heatmaps), `mechanisms` (secondary sinks,
massive activations, value-weighted attention, streaming, evaluation length),
`compare` (models side by side) and `training` (from-scratch training runs).
Nothing here runs a model; circuitsvis views are in `sinkmech.render`.
"""
