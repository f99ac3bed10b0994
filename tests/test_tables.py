"""What a table writes: Markdown as shown, a CSV of numbers a notebook reads, LaTeX that parses."""

import re

import pandas as pd

from ar2dlm.reporting.tables import TableFiles, TableText, write_table

TABLE = pd.DataFrame(
    {
        "model": ["tiny", "tiny"],
        "run": ["teacher", "ra_l1"],
        "synthetic_code: base_pass@1": ["0.812", "0.125 ± 0.055"],
        "synthetic_code: base_pass@1 kept": [None, "0.15"],
        "training FLOPs": [None, "1.23e+12 ± 4e+10"],
        "seeds": ["-", "0, 1, 2"],
    }
)


def unescaped(text: str, char: str) -> int:
    return len(re.findall(r"(?<!\\)" + re.escape(char), text))


def test_a_table_writes_numbers_to_csv_and_latex_that_parses(tmp_path):
    paths = [tmp_path / f"t.{ext}" for ext in ("md", "csv", "tex")]
    write_table(TABLE, TableText("ablations/lambda_1", "Study `x_y`, 100% of #1 & more."), TableFiles(*paths), "tiny")
    assert "0.125 ± 0.055" in paths[0].read_text()  # Markdown as shown

    csv = pd.read_csv(paths[1])
    ra = csv.set_index("run").loc["ra_l1"]
    assert ra["synthetic_code: base_pass@1 mean"] == 0.125 and ra["synthetic_code: base_pass@1 sd"] == 0.055
    assert ra["training FLOPs mean"] == 1.23e12 and ra["n seeds"] == 3
    assert (
        csv["synthetic_code: base_pass@1 mean"].dtype == float
        and csv.loc[0, "synthetic_code: base_pass@1 mean"] == 0.812
    )
    assert pd.isna(csv.set_index("run").loc["teacher", "synthetic_code: base_pass@1 sd"])

    tex = paths[2].read_text()
    for char in "_%#$":  # every special character escaped, the caption's and the cells' alike
        body = tex.replace("$\\pm$", "")
        assert unescaped(body, char) == 0, (char, tex)
    assert tex.count("{") - tex.count("\\{") == tex.count("}") - tex.count("\\}")
    rows = tex.split("\\midrule")[1].split("\\bottomrule")[0].strip().splitlines()
    assert len(rows) == 2 and all(unescaped(r, "&") == len(TABLE.columns) - 1 for r in rows)
    assert "0.125 $\\pm$ 0.055" in tex and "ra\\_l1" in tex and "\\label{tab:ablations-lambda-1}" in tex
