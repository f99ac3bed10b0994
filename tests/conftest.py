import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def run_snakemake(args, workdir, timeout=600, hub_cache=None, **env):
    """Run snakemake on this repo's Snakefile with ``workdir`` as working directory (and the hub
    cache folder ``hub_cache``, e.g. the stand-in hub)."""
    cmd = SNAKEMAKE + ["-s", str(REPO / "Snakefile"), "-d", str(workdir)] + list(args)
    env = dict(os.environ, HF_HUB_OFFLINE="1", **env)
    if hub_cache is not None:
        env["HF_HUB_CACHE"] = str(hub_cache)
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="session")
def standin_hub(tmp_path_factory):
    """A hub cache holding the paper preset's models and data sets as stand-ins (seconds)."""
    from ar2dlm.pipeline.standin_hub import write_paper_standin_hub

    cache = tmp_path_factory.mktemp("standin_hub")
    write_paper_standin_hub(cache)
    return cache


@pytest.fixture
def dry_run(tmp_path, standin_hub):
    """Dry-run all_tables with a config (a dict merged over a preset), the stand-in hub as the hub
    cache; returns the finished process."""

    def _run(
        config: dict | None = None, preset: str | None = "smoke", target: str = "all_tables", printshell: bool = False
    ):
        files = [str(REPO / "config" / "presets" / f"{preset}.yaml")] if preset else []
        if config is not None:
            path = tmp_path / "override.yaml"
            path.write_text(yaml.safe_dump(config))
            files.append(str(path))
        args = ["-n", target] + (["-p"] if printshell else []) + (["--configfile", *files] if files else [])
        return run_snakemake(args, tmp_path, timeout=120, hub_cache=standin_hub)

    return _run


@pytest.fixture(scope="session")
def smoke_tokenizer(tmp_path_factory):
    """A BPE tokenizer trained on a small synthetic corpus (seconds)."""
    from ar2dlm.data.code_suite import generate_code_suite
    from ar2dlm.data.corpus import suite_documents
    from ar2dlm.data.math_suite import generate_math_suite
    from ar2dlm.data.tokenization import train_bpe_tokenizer

    code, _ = generate_code_suite(300, 1, 0.2, 0)
    maths, _ = generate_math_suite(200, 1, 0)
    docs = suite_documents(code, maths)
    out = tmp_path_factory.mktemp("tok")
    return train_bpe_tokenizer((d["prompt"] + d["completion"] for d in docs), 400, out), docs


@pytest.fixture
def offline_hub(monkeypatch):
    """Make the Hugging Face hub unreachable for this test, whatever the machine's network."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
