"""Hugging Face hub assets: whether the local cache holds one, the
local folder a job reads it from, and the download that ``snakemake prefetch`` runs where the
network is. Compute jobs run with the hub offline (``HF_HUB_OFFLINE=1``): every hub data set is
read from its cached snapshot folder, so ``datasets`` never needs the hub (it would otherwise only
find data sets it had prepared itself), and lm-eval's and mteb's data sets are read the same way.

Models and tokenizers are ``model`` repositories; corpora, preference pairs, prompt sets and the
data sets of lm-eval and mteb tasks are ``dataset`` repositories."""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# Files a model job reads from a model repository (no other weight formats, no README media).
MODEL_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja")
# Data sets the hub serves only to an account that accepted their terms (their pages say so; the
# hub API says it only to a request that reaches it, so a missing copy is named before that).
GATED = {"Idavidrein/gpqa"}
# ``datasets`` builders named by ``path`` that read local ``data_files`` rather than a repository.
PACKAGED_BUILDERS = {
    "json",
    "csv",
    "parquet",
    "text",
    "arrow",
    "pandas",
    "webdataset",
    "xml",
    "imagefolder",
    "audiofolder",
}
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


class MissingAssetError(RuntimeError):
    """A hub asset the local cache lacks (compute jobs never download)."""


@dataclass(frozen=True)
class HubAsset:
    repo_id: str
    repo_type: str  # "model" | "dataset"
    revision: str | None = None
    used_by: tuple[str, ...] = field(default=(), compare=False)  # config keys, e.g. models.qwen3_8b

    @property
    def gated(self) -> bool:
        return self.repo_id in GATED

    @property
    def allow_patterns(self) -> list[str] | None:
        return list(MODEL_FILES) if self.repo_type == "model" else None

    def describe(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"{self.repo_type} {self.repo_id}{rev} (for {', '.join(self.used_by)})"


def is_hub_id(path: str | None) -> bool:
    """Whether a ``path`` of the config names a hub repository (not a local folder or file, not a
    ``datasets`` builder such as ``json``)."""
    return bool(path) and path not in PACKAGED_BUILDERS and not Path(path).exists() and bool(_REPO_ID.match(path))


def cached_per_version(package: str, what: str, key: str, compute, fresh=lambda value: True):
    """``compute()`` once per installed ``package`` version and ``key``, kept in
    ``~/.cache/ar2dlm/<package>-<version>-<what>.json`` (lm-eval's task index parses every task's
    config to build, and mteb's import is slow); recomputed when ``fresh(value)`` says the kept value went stale."""
    from importlib.metadata import version

    path = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "ar2dlm"
        / f"{package}-{version(package)}-{what}.json"
    )
    known = json.loads(path.read_text()) if path.is_file() else {}
    known = known if isinstance(known, dict) else {}  # a file of an older layout is rebuilt
    if key not in known or not fresh(known[key]):
        known[key] = compute()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, sort_keys=True))
        tmp.replace(path)
    return known[key]


def lm_eval_yaml_tasks() -> dict[str, str]:
    """Task name -> YAML file of the installed lm-eval, from its task files' ``task:`` lines only,
    where lm-eval's own index (``TaskManager``) parses every task's config (it found the same file for
    every task both list). Groups, tags and tasks a file lists are not here: callers fall back to the
    index for a name this does not know (cached per lm-eval version)."""

    def compute():
        import lm_eval.tasks

        line = re.compile(r"^task:\s*['\"]?([\w\-.]+)['\"]?\s*$", re.M)
        found = {}
        for f in sorted(Path(lm_eval.tasks.__file__).parent.rglob("*.yaml")):
            for m in line.finditer(f.read_text(errors="ignore")):
                found.setdefault(m.group(1), str(f))
        return found

    return cached_per_version("lm_eval", "yaml-tasks", "all", compute)


def lm_eval_task_path(task: str) -> str | None:
    """The YAML file of an installed lm-eval task (None when it has none or is unknown)."""
    path = lm_eval_yaml_tasks().get(task)
    if path is None:  # not a file's own task: lm-eval's full index knows the rest
        from lm_eval.tasks import TaskManager

        entry = TaskManager().task_index.get(task)
        path = None if entry is None or entry.yaml_path is None else str(entry.yaml_path)
    return path


def harness_entry(task: str) -> dict:
    """An installed lm-eval task's YAML file, the data set it reads and its first metric (cached)."""

    def compute():
        from lm_eval.tasks._yaml_loader import load_yaml

        path = lm_eval_task_path(task)
        if path is None:
            raise KeyError(f"{task!r} is not a YAML task of the installed lm-eval")
        cfg = load_yaml(path, resolve_func=False)
        return {
            "yaml_path": path,
            "path": cfg.get("dataset_path"),
            "name": cfg.get("dataset_name"),
            "revision": (cfg.get("dataset_kwargs") or {}).get("revision"),
            "metric": (cfg.get("metric_list") or [{}])[0].get("metric"),
        }

    return cached_per_version(
        "lm_eval", "task-facts", task, compute, fresh=lambda facts: Path(facts["yaml_path"]).exists()
    )  # a reinstall moves the files


def harness_task_config(task: str) -> dict:
    """An installed lm-eval task's full config (its ``include`` resolved, functions loaded), read
    from its YAML without building lm-eval's task index."""
    from lm_eval.tasks._yaml_loader import load_yaml

    return load_yaml(harness_entry(task)["yaml_path"], resolve_func=True)


def harness_dataset(task: str) -> dict:
    """{path, name, revision} of the data set an lm-eval task reads."""
    return {k: harness_entry(task)[k] for k in ("path", "name", "revision")}


@contextlib.contextmanager
def quiet_mteb():
    """mteb warns (a log line and a Python warning) for every beta task it builds: 504 lines for
    one listing of its tasks."""
    import logging
    import warnings

    log = logging.getLogger("mteb")
    level, log.level = log.level, logging.ERROR
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is currently in beta.*")
            yield
    finally:
        log.setLevel(level)


def mteb_dataset(task: str) -> dict:
    """{path, name, revision} of the data set an mteb task reads."""

    def compute():
        import mteb

        with quiet_mteb():
            ds = mteb.get_task(task).metadata.dataset
        return {"path": ds["path"], "name": ds.get("name"), "revision": ds.get("revision")}

    return cached_per_version("mteb", "task-facts", task, compute)


def local_snapshot(
    repo_id: str, repo_type: str = "dataset", revision: str | None = None, allow_patterns: list[str] | None = None
) -> str:
    """The cached snapshot folder of a hub repository; never downloads. Fails naming the
    repository and ``snakemake prefetch`` (and ``HF_TOKEN`` for a gated data set)."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(
            repo_id, repo_type=repo_type, revision=revision, allow_patterns=allow_patterns, local_files_only=True
        )
    except Exception as exc:  # LocalEntryNotFoundError, IncompleteSnapshotError
        raise MissingAssetError(missing_message([HubAsset(repo_id, repo_type, revision, ("this job",))])) from exc


def is_cached(asset: HubAsset) -> bool:
    try:
        local_snapshot(asset.repo_id, asset.repo_type, asset.revision, asset.allow_patterns)
        return True
    except MissingAssetError:
        return False


def missing_message(missing: list[HubAsset]) -> str:
    from huggingface_hub import constants

    lines = [
        f"the local Hugging Face cache ({constants.HF_HUB_CACHE}) lacks what these jobs read, and compute "
        "jobs never download (HF_HUB_OFFLINE=1):"
    ]
    lines += [f"  {a.describe()}" for a in missing]
    lines.append(
        "Run `snakemake prefetch` with the same --configfile where the network is (a login node), "
        "with HF_HOME shared with the compute nodes."
    )
    if any(a.gated for a in missing):
        lines.append(
            "Gated data sets (" + ", ".join(a.repo_id for a in missing if a.gated) + ") also need an "
            "account that accepted their terms on their hub page and its token in HF_TOKEN."
        )
    return "\n".join(lines)


def require_token(assets: list[HubAsset]) -> None:
    """Fail before any download when a gated data set is wanted and no hub token is set."""
    from huggingface_hub import get_token

    gated = [a for a in assets if a.gated and not is_cached(a)]
    if gated and not get_token():
        raise MissingAssetError(
            "gated data sets need a hub token and none is set: "
            + ", ".join(a.describe() for a in gated)
            + ". Accept their terms on "
            + ", ".join(f"https://huggingface.co/datasets/{a.repo_id}" for a in gated)
            + ", then set HF_TOKEN (or run `hf auth login`) and rerun `snakemake prefetch`."
        )


def prefetch(assets: list[HubAsset]) -> list[dict]:
    """Download every asset into the hub cache (skipping complete ones); one record per asset."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError

    require_token(assets)
    records = []
    for a in assets:
        try:
            folder = snapshot_download(
                a.repo_id, repo_type=a.repo_type, revision=a.revision, allow_patterns=a.allow_patterns
            )
        except GatedRepoError as exc:
            raise MissingAssetError(
                f"{a.describe()} is gated and the token in HF_TOKEN has no access to it: "
                f"accept its terms on its hub page ({type(exc).__name__})"
            ) from exc
        records.append(
            {
                "repo_id": a.repo_id,
                "repo_type": a.repo_type,
                "revision": a.revision,
                "snapshot": folder,
                "used_by": list(a.used_by),
            }
        )
        print(f"cached {a.describe()} -> {folder}", flush=True)
    return records


def load_hub_dataset(path: str, name: str | None = None, *, revision: str | None = None, **kwargs):
    """``datasets.load_dataset`` of a hub data set from its cached snapshot folder (other paths,
    builders and local folders as given)."""
    import datasets

    source = local_snapshot(path, revision=revision) if is_hub_id(path) else path
    return datasets.load_dataset(source, name, **kwargs)
