"""The ``code_completion`` lm-eval task's data: the problems file named by ``--metadata problems=PATH``."""

from pathlib import Path


def load_problems(problems: str | None = None, **_):
    import datasets

    from ar2dlm.evaluation.code import read_problems

    if not problems or not Path(problems).is_file():
        raise ValueError(f"code_completion needs --metadata problems=<a HumanEval-format JSONL file>, got {problems!r}")
    # only the columns a prompt needs: HumanEval+'s test inputs mix types that a data set column cannot hold
    rows = [{k: p[k] for k in ("task_id", "prompt", "entry_point")} for p in read_problems(problems)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
