"""How the gamma search chooses on its curve, without torch: the claims judge reads a curve's points
with the rule the search used (``ar2dlm.reporting.claims``, imported by the DAG build)."""

from __future__ import annotations


def best_point(points: list[dict]) -> dict:
    """The point with the highest reward accuracy on the search pairs, the smallest gamma among ties."""
    return max(points, key=lambda p: (p["reward_accuracy"], -p["gamma"]))
