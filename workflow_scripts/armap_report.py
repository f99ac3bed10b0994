import yaml

from ar2dlm.pipeline.resolved import resolve
from ar2dlm.provenance import log_to
from ar2dlm.reporting.armap import armap_machines, gamma_figure, main_table, merges_table, shadowing_figure
from ar2dlm.reporting.tables import TableFiles, TableText, provenance_footer, reported_rows, write_table

log_to(snakemake.log[0])
resolved, out = resolve(snakemake.params.config), snakemake.output
config = resolved.config
a = config["armap"]
header = (
    f"Preset `{config['preset']}`, runs {', '.join(a['runs'])}, seeds {', '.join(map(str, a['seeds']))}. "
    "Measured by this pipeline; mean ± standard deviation over seeds."
)
footer = provenance_footer(settings=a, machines=armap_machines(resolved))
write_table(
    main_table(resolved),
    TableText("AR-MAP: main table", header, footer),
    TableFiles(out.main, out.main_csv, out.main_tex),
    config["preset"],
    reported_rows(yaml.safe_load(open(snakemake.input.reported)) or {}, "armap/main", config["preset"]),
)
write_table(
    merges_table(resolved),
    TableText("AR-MAP: task arithmetic vs TIES vs DARE", header, footer),
    TableFiles(out.merges, out.merges_csv, out.merges_tex),
    config["preset"],
)
gamma_figure(resolved, out.gamma_pdf, out.gamma_png)
shadowing_figure(resolved, out.shadow_pdf, out.shadow_png)
