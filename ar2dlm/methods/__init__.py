"""Conversion methods and loss terms, one module each, collected in a registry
(:mod:`ar2dlm.methods.registry`) that run resolution, the config checks and schema, the memory
planner and the trainer's objective factory look up: mdlm, repr_align, efficient_dlm, opdlm and
dpo (AR-MAP's direct DPO baseline) are methods; alignment and distillation are loss terms a run of
any method may add. A module here registers by defining ``METHOD`` or ``TERM``; one written outside
the package registers itself with ``registry.register`` when a module the config's ``methods:``
list names is imported."""
