"""Static matplotlib figures for write-ups (PNG, SVG, PDF), one module per topic.

`core` holds what every figure shares (saving, heatmap panels, shared colour
limits, layer lines); the topic modules draw one kind of result each:
`sinks` (first-token scores and sink rates), `spread` (perturbation spread),
`dormant` (dormant-head norms and bands), `patching` (patching / ablation
heatmaps), `mechanisms` (secondary sinks, massive activations, value-weighted
attention, streaming, evaluation length), `compare` (models side by side) and
`training` (from-scratch training runs). Nothing here runs a model; circuitsvis
views are in `sinkmech.render`.
"""
