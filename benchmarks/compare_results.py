"""Compare the tables and claims of two results folders, less measured speeds and times.

    python benchmarks/compare_results.py BEFORE/results AFTER/results

Prints every table cell and claim that differs (CSV tables under tables/ and claims.csv); columns
that hold measured speeds or wall times (tokens/s, seconds) are left out, since they vary from run
to run on the same machine, and so are the measured values of the claims whose measure is a speed
(effect, interval, verdict; what each claim is still compared) and the commit each row was computed
at. Exits 1 when something else differs.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

# a measured speed or time in a column's name or a claim's measure (tokens_per_step is a count, not a speed)
SPEED = re.compile(r"tokens/s|tokens_per_s\b|seconds|wall")
PROVENANCE = ("commit",)  # the checkout that computed a row: differs by design between the two runs
# what a claim is, compared even where its measure is a speed (the rest of such a row is measured)
CLAIM_IDENTITY = ("id", "paper", "claim", "study", "measure", "test", "seeds", "quote")


def frames(root: Path) -> dict[str, pd.DataFrame]:
    files = sorted((root / "tables").rglob("*.csv")) + [root / "claims.csv"]
    return {str(f.relative_to(root)): pd.read_csv(f) for f in files}


def compared(column: str) -> bool:
    return column not in PROVENANCE and not SPEED.search(column)


def measures_speed(frame: pd.DataFrame) -> pd.Series:
    """The rows of a claims table whose measure is a speed (all False for other tables)."""
    if "measure" not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame["measure"].astype(str).map(lambda m: bool(SPEED.search(m)))


def compare(before: Path, after: Path) -> list[str]:
    a, b = frames(before), frames(after)
    out = [f"{name}: only in {'before' if name in a else 'after'}" for name in sorted(set(a) ^ set(b))]
    for name in sorted(set(a) & set(b)):
        x, y = a[name], b[name]
        cols = [c for c in x.columns if compared(c)]
        for c in sorted(set(cols) ^ {c for c in y.columns if compared(c)}):
            out.append(f"{name}: column {c!r} in only one")
        if len(x) != len(y):
            out.append(f"{name}: {len(x)} rows before, {len(y)} after")
            continue
        speed_rows = measures_speed(x) | measures_speed(y)
        for c in [c for c in cols if c in y.columns]:
            for i, (u, v) in enumerate(zip(x[c], y[c])):
                if speed_rows[i] and c not in CLAIM_IDENTITY:
                    continue
                if not (u == v or (pd.isna(u) and pd.isna(v))):
                    key = x.iloc[i].get("id", x.iloc[i].get("run", i))
                    out.append(f"{name} [{key}] {c}: {u!r} -> {v!r}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args()
    diffs = compare(args.before, args.after)
    print("\n".join(diffs) if diffs else "tables and claims equal (less measured speeds)")
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
