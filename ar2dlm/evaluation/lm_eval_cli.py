"""lm-eval's command line with this project's model class registered as ``ar2dlm``:

    python -m ar2dlm.evaluation.lm_eval_cli run --model ar2dlm \
        --model_args pretrained=results/models/tiny/ed/seed0/step_800,threshold=0.9 --tasks gsm8k
    ar2dlm-lm-eval run --model ar2dlm ...        # the same, installed as a console script

lm-eval 0.4 finds model classes among its own modules only (no plugin entry points), so
``lm_eval --model ar2dlm`` cannot see a class registered by another package until that package is
imported: this imports it, then runs lm-eval's own command line. Every ``HarnessLM`` argument is a
``--model_args`` key (``pretrained``, ``threshold``, ``steps_per_block``, ``block_size``,
``elbo_samples``, ``max_gen_toks``, ``dtype``) but ``device`` and ``batch_size``, which lm-eval's
own ``--device`` and ``--batch_size`` set. This package's tasks (``ar2dlm/evaluation/tasks``: the
``code_completion`` task, whose responses ``python -m ar2dlm.evaluation.rescore`` scores) are on the
task path unless ``--include_path`` names another folder.
"""

import sys

from lm_eval.__main__ import cli_evaluate

from . import harness  # noqa: F401  registers HarnessLM as "ar2dlm"
from .suite import LOCAL_TASKS


def main() -> None:
    if sys.argv[1:2] == ["run"] and not any(a.startswith("--include_path") for a in sys.argv):
        sys.argv += ["--include_path", str(LOCAL_TASKS)]
    cli_evaluate()


if __name__ == "__main__":
    main()
