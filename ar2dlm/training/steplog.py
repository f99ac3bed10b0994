"""The training loop's record of each step: one row (step, loss and each loss term, lr, grad_norm,
tokens, tokens/s, step time, FLOPs) appended to the run's log and sent to the experiment tracker.

The log is JSON lines (``log.jsonl`` of a conversion run, what tables and manifests read), or CSV
for a path ending ``.csv`` (the AR teacher's loss curve, a spreadsheet's format). Rank 0 writes
it; a resumed run keeps the rows before the step it resumes from, so the log holds one row per
step across a killed attempt and its resumption."""

from __future__ import annotations

import csv
import json
from pathlib import Path


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        return float(text)


class StepLog:
    """A run's step log; ``enabled`` False (ranks other than 0) writes nothing. ``tracker``: an
    experiment tracker (``tracking.Tracker``) that receives every row too."""

    def __init__(self, path, *, start: int = 0, tracker=None, enabled: bool = True):
        self.path, self.tracker, self.enabled = Path(path), tracker, enabled
        self.csv = self.path.suffix == ".csv"
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept = [r for r in self.rows() if r["step"] < start]
            self.path.write_text("")
            for row in kept:
                self._append(row)

    def rows(self) -> list[dict]:
        """The rows written so far (none when the log does not exist yet)."""
        if not self.path.is_file():
            return []
        with open(self.path, newline="") as f:
            if self.csv:
                return [{k: _number(v) for k, v in r.items()} for r in csv.DictReader(f)]
            return [json.loads(line) for line in f if line.strip()]

    def _append(self, row: dict) -> None:
        with open(self.path, "a", newline="") as f:
            if not self.csv:
                f.write(json.dumps(row) + "\n")
                return
            writer = csv.DictWriter(f, fieldnames=list(row))
            if f.tell() == 0:
                writer.writeheader()
            writer.writerow(row)

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        self._append(row)
        if self.tracker is not None:
            self.tracker.log(row, row["step"])

    def close(self) -> None:
        if self.enabled and self.tracker is not None:
            self.tracker.close()
