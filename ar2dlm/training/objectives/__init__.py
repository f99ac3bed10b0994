"""The objectives the methods' declarations (:mod:`ar2dlm.methods`) name by import path: the code a
training step runs, kept apart so that reading a config imports no torch."""
