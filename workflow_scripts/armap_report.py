from pathlib import Path

from ar2dlm.armap.report import gamma_figure, main_table, merges_table, shadowing_figure
from ar2dlm.provenance import log_to

log_to(snakemake.log[0])
config, out = snakemake.params.config, snakemake.output
a = config["armap"]
header = (f"Preset `{config['preset']}`, runs {', '.join(a['runs'])}, seeds {', '.join(map(str, a['seeds']))}. "
          "Measured by this pipeline; mean ± standard deviation over seeds.")
for df, md, csv, tex, title in ((main_table(config), out.main, out.main_csv, out.main_tex, "AR-MAP: main table"),
                                (merges_table(config), out.merges, out.merges_csv, out.merges_tex,
                                 "AR-MAP: task arithmetic vs TIES vs DARE")):
    Path(md).write_text(f"# {title}\n\n{header}\n\n{df.to_markdown(index=False)}\n")
    df.assign(preset=config["preset"]).to_csv(csv, index=False)
    Path(tex).write_text(df.to_latex(index=False, caption=f"{title}. {header}".replace("`", "").replace("±", "$\\pm$"))
                         .replace("±", "$\\pm$"))
gamma_figure(config, out.gamma_pdf, out.gamma_png)
shadowing_figure(config, out.shadow_pdf, out.shadow_png)
