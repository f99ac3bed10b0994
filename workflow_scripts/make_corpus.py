from ar2dlm.data.build import CorpusFiles, build_corpus
from ar2dlm.provenance import log_to

log_to(snakemake.log[0])
inp, out = snakemake.input, snakemake.output
print(
    build_corpus(
        snakemake.params.data,
        inp.tokenizer,
        inp.code_train,
        inp.math_train,
        CorpusFiles(out.manifest, out.subset, out.get("stream")),
    )
)
