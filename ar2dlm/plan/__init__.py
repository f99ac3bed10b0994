"""Memory and time planning of conversion jobs (``python -m ar2dlm.plan``)."""
