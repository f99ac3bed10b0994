"""AR-MAP: task vectors and merges, their spectra, the reward-guided gamma search, DPO (AR and DLM)."""
