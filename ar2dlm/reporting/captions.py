"""Captions of the study tables and figures in ``snakemake --report`` (reStructuredText, which the
report renders): what a table or figure shows, over how many seeds, and where its numbers are as CSV.
The static captions (AR-MAP, claims, summaries) are the .rst files under ``report/``."""

from __future__ import annotations

from ..pipeline import layout
from ..pipeline.resolved import Resolved, Study

# What each figure kind draws (the schema's studies.*.figure; a test ties the keys to FIGURE_KINDS)
FIGURE_CAPTIONS = {
    "lambda": "the score against the alignment weight lambda (symlog axis; lambda 0 is plain MDLM)",
    "steps": "the score against the training step, one line per run",
    "throughput": "accuracy against decoding tokens/s over the decoding thresholds, one line per run and block size",
    "tokens_per_step": "accuracy against tokens decoded per model forward over the decoding thresholds",
    "speedup": "accuracy against tokens/s as a multiple of the AR teacher's (point labels: thresholds)",
    "budget": "held-out NLL per token (the ELBO bound) against the training tokens each checkpoint had seen",
    "flops": "the score against the training FLOPs each run counted (student, teacher, rollouts)",
    "retention": "the share of the AR teacher's score kept against training tokens, one line per method "
    "(point labels: epochs of the run's training rows)",
}


def seeds_phrase(counts: list[int]) -> str:
    """``mean ± sd over 3 seeds`` (``over 1-3 seeds`` where runs differ), from each point's seed count."""
    lo, hi = min(counts), max(counts)
    if hi == 1:
        return "one seed, no spread"
    return f"mean ± sd over {lo if lo == hi else f'{lo}-{hi}'} seeds"


def _members(study: Study) -> tuple[str, str]:
    members = study.members
    runs = ", ".join(f"``{r}``" for r in dict.fromkeys(m.run for m in members))
    seeds = sorted({s for m in members for s in m.seeds})
    listed = f"seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}"
    return runs, f"{seeds_phrase([len(m.seeds) for m in members])} ({listed})"


def study_table_caption(resolved: Resolved, study: str) -> str:
    st = resolved.studies[study]
    runs, seeds = _members(st)
    return (
        f"**{study}** (preset ``{resolved.preset}``, models {', '.join(st.models)}): "
        f"runs {runs} at their final checkpoint and the AR teacher, on {', '.join(st.evals)}; "
        f"cells: {seeds}; a *kept* column is the share of the teacher's score. The papers' reported "
        f"numbers follow the table, never mixed with ours. Numeric: ``{layout.study_table(study, 'csv')}`` "
        f"(mean and sd columns, n seeds); LaTeX: ``{layout.study_table(study, 'tex')}``."
    )


def study_figure_caption(resolved: Resolved, study: str) -> str:
    st = resolved.studies[study]
    runs, seeds = _members(st)
    return (
        f"**{study}** (preset ``{resolved.preset}``): {FIGURE_CAPTIONS[st.spec['figure']]}, on "
        f"{st.evals[0]}; runs {runs}; points: {seeds}; the AR teacher wherever it has the plotted measure (a "
        f"dashed line; a star where the x axis is a speed). The numbers: ``{layout.study_table(study, 'csv')}``."
    )
