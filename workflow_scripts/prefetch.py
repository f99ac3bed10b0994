import os

os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "0"  # this job is the one that downloads

from ar2dlm.core.hub import HubAsset, prefetch  # noqa: E402
from ar2dlm.provenance import log_to  # noqa: E402

log_to(snakemake.log[0], snakemake.threads)
assets = [HubAsset(**{**a, "used_by": tuple(a["used_by"])}) for a in snakemake.params.assets]
records = prefetch(assets)
print(f"{len(records)} hub assets cached")
