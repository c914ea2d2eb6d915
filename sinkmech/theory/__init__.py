"""The theory of the sink as a brake on over-mixing: Jacobian norms (`jacobian`),
the sensitivity study and rank collapse (`sensitivity`) and a test of the bound's
ranking (`bound_ranking`).
"""
