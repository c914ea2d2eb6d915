"""The report's default page: each section computes its numbers, draws its
figures and returns a `Section` (HTML, summary.json entry, circuitsvis views).

Sinks and norms and heads up close are in `sections_sinks`; the perturbation
spread, dormant heads and sink ablation / patching in `sections_interventions`;
secondary sinks, massive activations, value-weighted attention, streaming and
evaluation length (how the sink works, past the first-token score) in
`sections_mechanisms`.
"""

from __future__ import annotations

from collections.abc import Callable

from sinkmech.report.context import ReportContext, Section
from sinkmech.report.sections_mechanisms import (
    key_sinks_section, length_section, massive_section, stream_section, value_weighted_section,
)
from sinkmech.report.sections_interventions import ablation_section, dormant_section, spread_section
from sinkmech.report.sections_sinks import head_views_section, norms_section, sink_section

SECTIONS: list[Callable[[ReportContext], Section]] = [
    sink_section, norms_section, head_views_section, spread_section, dormant_section, ablation_section,
    key_sinks_section, massive_section, value_weighted_section, stream_section, length_section,
]
