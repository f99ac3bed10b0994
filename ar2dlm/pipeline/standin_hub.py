"""The stand-in hub cache (``ar2dlm.data.standins``) at the revisions the paper preset pins, so
that preset runs with no network and no GPU:

    python -m ar2dlm.pipeline.standin_hub HUB_CACHE [EVALPLUS_CACHE]

writes the stand-in repositories into HUB_CACHE (the folder ``HF_HUB_CACHE`` points at) and, with
EVALPLUS_CACHE, evalplus's HumanEval+ and MBPP+ release files into it."""

from __future__ import annotations

import sys
from pathlib import Path

from ..data.standins import write_evalplus_release, write_standin_hub
from .assets import hub_assets
from .config import load_preset

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"


def write_paper_standin_hub(cache: str | Path) -> list[str]:
    """Every stand-in repository into the hub cache folder ``cache``, a data set the paper preset
    reads at a pinned commit (mteb pins one per task) under that commit. Returns the repository ids."""
    revisions = {a.repo_id: a.revision for a in hub_assets(load_preset("paper", CONFIG_DIR)) if a.revision}
    return write_standin_hub(cache, revisions)


def main(argv: list[str]) -> None:
    if len(argv) not in (1, 2):
        sys.exit(__doc__)
    print("\n".join(write_paper_standin_hub(argv[0])))
    if len(argv) == 2:
        print("\n".join(map(str, write_evalplus_release(argv[1]))))


if __name__ == "__main__":
    main(sys.argv[1:])
