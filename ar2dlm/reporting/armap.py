"""AR-MAP's tables and figures: the main table (DLM base, direct DLM DPO, AR-MAP at gamma_hat, AR
DPO teacher), merges compared (task arithmetic, TIES, DARE), reward accuracy against gamma per
domain, and spectral shadowing by layer and module averaged over seeds."""

from __future__ import annotations

import pandas as pd

from ..pipeline import layout
from ..pipeline.jobs import direct_objectives, dlm_dpo_seeds, search_seeds
from ..pipeline.resolved import Resolved
from ..provenance import read_json
from .figures import pyplot, save
from .tables import machine_note, mean_sd

# the rows of AR-MAP's baselines trained directly on the DLM (armap.dlm_<objective>)
DIRECT_LABELS = {
    "dpo": "DLM DPO (direct, VRPO's estimator)",
    "plain_dpo": "DLM DPO (direct, plain ELBO estimator)",
    "simpo": "DLM SimPO (direct)",
}


def armap_report_inputs(resolved: Resolved) -> list[str]:
    a, out = resolved.config["armap"], []
    dpo_seeds = dlm_dpo_seeds(a)
    for m, r, s in resolved.armap.dlms:
        out += [layout.gamma_curve(m, r, s, d, g) for d in a["domains"] for g in a["merges"] if s in search_seeds(a, g)]
        out += [layout.spectra_csv(m, r, s, d) for d in a["domains"]]
        step = resolved.run(r).steps
        for d in a["domains"]:
            for b in a["evals"].get(d, []):
                out.append(layout.eval_path(b, m, r, s, step))
                if s in dpo_seeds:
                    out += [
                        layout.derived_eval_path(b, m, r, s, layout.direct_name(d, o)) for o in direct_objectives(a)
                    ]
                out += [layout.derived_eval_path(b, m, r, s, layout.armap_name(d, g)) for g in a["eval_merges"]]
                out += [layout.teacher_dpo_eval_path(b, m, d, s), layout.eval_path(b, m, "teacher")]
    return sorted(set(out))


def armap_machines(resolved: Resolved) -> str:
    """Where AR-MAP's numbers were computed (see ``tables.machine_note``): its evaluations and gamma searches."""
    return machine_note(
        [
            ("gamma search" if path.endswith("gamma.json") else "evaluation", read_json(path))
            for path in armap_report_inputs(resolved)
            if path.endswith(".json")
        ]
    )


def _dlm_seeds(resolved: Resolved) -> dict[tuple[str, str], list[int]]:
    """The seeds of each (model, run) receiving AR-MAP's vector, in armap.runs order."""
    out = {}
    for m, r, s in resolved.armap.dlms:
        out.setdefault((m, r), []).append(s)
    return out


def main_table(resolved: Resolved) -> pd.DataFrame:
    """Per domain, benchmark and DLM run: the DLM, the DLM DPO'd directly, AR-MAP (each evaluated
    merge at gamma_hat), the AR teacher and its DPO version; mean ± sd over seeds."""
    a, rows = resolved.config["armap"], []
    dpo_seeds = dlm_dpo_seeds(a)
    for d in a["domains"]:
        for b in a["evals"].get(d, []):
            metric = resolved.benchmarks[b].headline_metric
            for (m, run), seeds in _dlm_seeds(resolved).items():
                step = resolved.run(run).steps
                variants = {
                    "DLM (base)": [layout.eval_path(b, m, run, s, step) for s in seeds],
                }
                for o in direct_objectives(a):
                    variants[DIRECT_LABELS[o]] = [
                        layout.derived_eval_path(b, m, run, s, layout.direct_name(d, o))
                        for s in seeds
                        if s in dpo_seeds
                    ]
                for g in a["eval_merges"]:
                    variants[f"AR-MAP {g} (gamma_hat)"] = [
                        layout.derived_eval_path(b, m, run, s, layout.armap_name(d, g)) for s in seeds
                    ]
                for label, paths in variants.items():
                    vals = [read_json(path)["metrics"][metric] for path in paths]
                    rows.append(
                        {
                            "domain": d,
                            "benchmark": b,
                            "metric": metric,
                            "model": m,
                            "run": run,
                            "system": label,
                            "value": mean_sd(vals),
                            "seeds": len(vals),
                        }
                    )
            for m in sorted({m for m, _ in _dlm_seeds(resolved)}):
                for label, paths in (
                    ("AR teacher", [layout.eval_path(b, m, "teacher")]),
                    ("AR teacher DPO", [layout.teacher_dpo_eval_path(b, m, d, s) for s in a["seeds"]]),
                ):
                    vals = [read_json(path)["metrics"][metric] for path in paths]
                    rows.append(
                        {
                            "domain": d,
                            "benchmark": b,
                            "metric": metric,
                            "model": m,
                            "run": "teacher",
                            "system": label,
                            "value": mean_sd(vals),
                            "seeds": len(vals),
                        }
                    )
    return pd.DataFrame(rows)


def merges_table(resolved: Resolved) -> pd.DataFrame:
    """gamma_hat and held-out (test half) reward accuracy per merge, domain and DLM run, over seeds."""
    a, rows = resolved.config["armap"], []
    for d in a["domains"]:
        for (m, run), seeds in _dlm_seeds(resolved).items():
            for g in a["merges"]:
                searched = search_seeds(a, g)
                curves = [read_json(layout.gamma_curve(m, run, s, d, g)) for s in seeds if s in searched]
                test = [{c["gamma"]: c["test_reward_accuracy"] for c in cv["curve"]} for cv in curves]
                rows.append(
                    {
                        "domain": d,
                        "model": m,
                        "run": run,
                        "merge": g,
                        "gamma_hat": mean_sd([c["gamma_hat"] for c in curves]),
                        "test reward acc. at gamma_hat": mean_sd([t[c["gamma_hat"]] for t, c in zip(test, curves)]),
                        "test reward acc. at gamma 1": mean_sd([t.get(1, float("nan")) for t in test]),
                        "seeds": len(curves),
                    }
                )
    return pd.DataFrame(rows)


def gamma_figure(resolved: Resolved, pdf_path, png_path) -> None:
    plt = pyplot()

    a = resolved.config["armap"]
    fig, axes = plt.subplots(1, len(a["domains"]), figsize=(4.2 * len(a["domains"]), 3.3), squeeze=False)
    dlm_seeds = _dlm_seeds(resolved)
    for ax, d in zip(axes[0], a["domains"]):
        for ((m, run), run_seeds), g in [(ms, g) for ms in dlm_seeds.items() for g in a["merges"]]:
            seeds = search_seeds(a, g)
            rows = [c for s in run_seeds if s in seeds for c in read_json(layout.gamma_curve(m, run, s, d, g))["curve"]]
            df = (
                pd.DataFrame(rows).groupby("gamma")["test_reward_accuracy"].agg(["mean", "std"]).fillna(0).reset_index()
            )
            label = g if seeds == a["seeds"] else f"{g} (seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))})"
            label = f"{run}: {label}" if len(dlm_seeds) > 1 else label
            ax.errorbar(df["gamma"], df["mean"], yerr=df["std"], marker="o", capsize=3, label=label)
        ax.axvline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("gamma")
        ax.set_ylabel("batch reward accuracy (held-out half)")
        ax.set_title(f"{d} ({resolved.preset} preset, seeds {', '.join(map(str, a['seeds']))})", fontsize=8)
        ax.legend(fontsize=7)
    save(fig, pdf_path, png_path)


def plot_shadowing(table: pd.DataFrame, title: str, pdf_path, png_path) -> None:
    """Shadowing ratio by layer, one line per module type (log scale; 1 = equal spectral norms), from
    a spectra table (``armap.spectra``): one job's, or the mean over seeds and domains."""
    plt = pyplot()

    layered = table.dropna(subset=["layer"])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for module, part in layered.groupby("module"):
        part = part.sort_values("layer")
        ax.plot(part["layer"], part["shadowing_ratio"], marker="o", label=module)
    for _module, part in table[table["layer"].isna()].groupby("module"):
        ax.axhline(float(part["shadowing_ratio"].iloc[0]), ls=":", lw=1, color="grey")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("||tau_diffusion||_2 / ||tau_pref||_2")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    save(fig, pdf_path, png_path)


def shadowing_figure(resolved: Resolved, pdf_path, png_path) -> pd.DataFrame:
    """Mean shadowing ratio by layer and module over seeds and domains."""
    a = resolved.config["armap"]
    frames = [pd.read_csv(layout.spectra_csv(m, r, s, d)) for m, r, s in resolved.armap.dlms for d in a["domains"]]
    df = pd.concat(frames)
    mean = df.groupby(["parameter", "module", "module_type"], dropna=False)["shadowing_ratio"].mean().reset_index()
    mean["layer"] = mean["parameter"].str.extract(r"\.layers\.(\d+)\.")[0].astype(float)
    plot_shadowing(
        mean, f"spectral shadowing, mean over seeds and domains ({resolved.preset} preset)", pdf_path, png_path
    )
    return mean
