"""Embeddings: a mean-pooled encoder for mteb 2.x, bidirectional for DLMs and causal for AR models.

The tiny preset's retrieval tasks (CODE_RETRIEVAL: docstring to function, function to docstring,
examples to function, over the held-out code suite) are mteb ``AbsTaskRetrieval`` tasks whose data
is built in memory, so mteb's own retrieval evaluator scores them offline; the paper preset names
mteb tasks from config. The headline score is their mean, as MTEB averages its tasks.
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.attention import attention_mask, position_ids
from ..core.conventions import Conventions
from ..core.sampling import left_pad


class MeanPooledEncoder:
    """mteb encoder protocol over one of this pipeline's models: mean of the last hidden states
    over real tokens. A DLM encodes with full bidirectional attention (its training attention
    without blocks); an AR model encodes causally, as it was trained."""

    def __init__(self, model, tokenizer, conv: Conventions, name: str, batch_size: int = 32, max_length: int = 512):
        from mteb.models.model_meta import ModelMeta

        self.model, self.tokenizer, self.conv = model.eval(), tokenizer, conv
        self.batch_size, self.max_length = batch_size, max_length
        self.mteb_model_meta = ModelMeta.create_empty({"name": f"ar2dlm/{name}", "revision": "local"})

    @torch.no_grad()
    def embed(self, texts: list[str]) -> np.ndarray:
        out = []
        for i in range(0, len(texts), self.batch_size):
            ids = [
                self.tokenizer.encode(t, add_special_tokens=False)[: self.max_length] or [self.conv.eos_token_id]
                for t in texts[i : i + self.batch_size]
            ]
            x, valid = left_pad(ids, self.conv.pad_token_id)
            x, valid = x.to(self.model.device), valid.to(self.model.device)
            mode = "causal" if not self.conv.is_diffusion else "bidirectional"
            mask = attention_mask(mode, valid, dtype=next(self.model.parameters()).dtype)
            pos = position_ids(valid)
            h = self.model.model(input_ids=x, attention_mask=mask, position_ids=pos).last_hidden_state.float()
            w = valid.unsqueeze(-1).float()
            out.append(((h * w).sum(1) / w.sum(1)).cpu().numpy())
        return np.concatenate(out)

    def encode(self, inputs, *, task_metadata=None, hf_split=None, hf_subset=None, prompt_type=None, **kwargs):
        texts = []
        for batch in inputs:
            titles = batch.get("title")
            for j, text in enumerate(batch["text"]):
                title = titles[j] if titles else ""
                texts.append(f"{title}\n{text}" if title else text)
        return self.embed(texts)

    def similarity(self, a, b):
        a, b = torch.as_tensor(np.asarray(a)), torch.as_tensor(np.asarray(b))
        return torch.nn.functional.normalize(a, dim=-1) @ torch.nn.functional.normalize(b, dim=-1).T

    def similarity_pairwise(self, a, b):
        a, b = torch.as_tensor(np.asarray(a)), torch.as_tensor(np.asarray(b))
        return (torch.nn.functional.normalize(a, dim=-1) * torch.nn.functional.normalize(b, dim=-1)).sum(-1)


# Retrieval tasks built here from the held-out code suite (no download): what the query is and what it finds
CODE_RETRIEVAL = {
    "docstring_retrieval": "a task's docstring (examples removed) finds its function",
    "function_to_docstring": "a function (signature and body, no docstring) finds its docstring",
    "example_retrieval": "a task's doctest examples (calls and results, the name hidden) find its function",
}


def _code_parts(task: dict) -> dict[str, str]:
    """A held-out task's docstring text, its doctest examples and its function without the docstring."""
    signature, _, rest = task["prompt"].partition('"""')
    doc = rest.partition('"""')[0]
    text, _, examples = doc.partition(">>>")
    return {
        "docstring": text.strip(),
        # the call's name would give the function away by string match: the examples call f
        "examples": (">>>" + examples).replace(task["entry_point"], "f").strip() if examples else "",
        "function": signature.rstrip() + "\n" + task["canonical_solution"],
    }


def code_retrieval_task(name: str, tasks: list[dict]):
    """An mteb retrieval task over the held-out code suite (CODE_RETRIEVAL): each query has one
    relevant document, built in memory so mteb's own retrieval evaluator scores it offline."""
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
    from mteb.abstasks.task_metadata import TaskMetadata

    query_part, doc_part, title = {
        "docstring_retrieval": ("docstring", "function", "DocstringToFunction"),
        "function_to_docstring": ("function", "docstring", "FunctionToDocstring"),
        "example_retrieval": ("examples", "function", "ExamplesToFunction"),
    }[name]
    parts = [_code_parts(t) for t in tasks]
    parts = [p for p in parts if p[query_part] and p[doc_part]]
    queries = [{"id": f"q{i}", "text": p[query_part]} for i, p in enumerate(parts)]
    corpus = [{"id": f"d{i}", "text": p[doc_part], "title": ""} for i, p in enumerate(parts)]
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(len(parts))}

    class CodeRetrieval(AbsTaskRetrieval):
        metadata = TaskMetadata(
            name=f"ar2dlm-{title}",
            type="Retrieval",
            main_score="ndcg_at_10",
            description=f"Held-out synthetic code tasks: {CODE_RETRIEVAL[name]}.",
            reference=None,
            dataset={"path": "local", "revision": "1"},
            category="t2t",
            eval_splits=["test"],
            eval_langs=["eng-Latn"],
            date=None,
            dialect=[],
            domains=["Programming"],
            task_subtypes=[],
            license="not specified",
            annotations_creators="derived",
            modalities=["text"],
            sample_creation="created",
            bibtex_citation="",
        )

        def load_data(self, num_proc=None, **kwargs):
            split = RetrievalSplitData(
                queries=Dataset.from_list(queries),
                corpus=Dataset.from_list(corpus),
                relevant_docs=qrels,
                top_ranked=None,
            )
            self.dataset = {"default": {"test": split}}
            self.data_loaded = True

    return CodeRetrieval()


REPORTED_SCORES = ("main_score", "ndcg_at_10", "map_at_10", "mrr_at_10", "recall_at_1", "recall_at_10")


def cached_mteb_task(name: str):
    """An mteb task by name, reading its data set from the cached hub snapshot (jobs run with the
    hub offline; ``datasets`` would otherwise ask the hub)."""
    import mteb

    from ..core.hub import local_snapshot

    task = mteb.get_task(name)
    ds = task.metadata.dataset  # mteb passes it to load_dataset (a local folder ignores the revision)
    ds["path"] = local_snapshot(ds["path"], revision=ds.get("revision"))
    return task


def evaluate_embeddings(encoder: MeanPooledEncoder, tasks) -> dict:
    """Run mteb tasks (task objects or names) with no result cache; returns {task: scores}."""
    import mteb

    tasks = [cached_mteb_task(t) if isinstance(t, str) else t for t in tasks]
    result = mteb.evaluate(
        encoder, tasks, cache=None, show_progress_bar=False, encode_kwargs={"batch_size": encoder.batch_size}
    )
    out = {}
    for task_result in result.task_results:
        scores = task_result.scores
        split = next(iter(scores))
        out[task_result.task_name] = {k: float(v) for k, v in scores[split][0].items() if k in REPORTED_SCORES}
    return out
