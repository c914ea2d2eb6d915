"""What `<bos>` does, by controls: the model with and without it (`compare`, the
paper's Table 2 on one model), another token or position in its place (`first_token`),
and how much of its cost the sink heads carry (`bos_cost`).
"""
