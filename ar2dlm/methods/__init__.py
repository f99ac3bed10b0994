"""Conversion methods and loss terms, one module each, collected in a registry
(:mod:`ar2dlm.methods.registry`) that run resolution, the config checks and schema, the memory
planner and the trainer's objective factory look up: mdlm, repr_align, efficient_dlm, opdlm and
dpo (AR-MAP's direct DPO baseline) are methods; alignment and distillation are loss terms a run of
any method may add. A module registers by defining ``METHOD`` or ``TERM``: one here when the
registry is imported, one outside the package when the config's ``methods:`` list names it."""
