"""The pipeline's bookkeeping: config, runs, cross-key checks, job lists, the results layout."""
