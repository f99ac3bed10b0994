"""The module groups a run may freeze (``freeze:``), by Qwen3 parameter name."""

from __future__ import annotations

FREEZE_GROUPS = {  # Qwen3 parameter-name patterns of each module group
    "embeddings": ("model.embed_tokens.",),
    "lm_head": ("lm_head.",),
    "mlp": (".mlp.",),
    "attention": (".self_attn.",),
    "norms": ("layernorm.", "model.norm.", "_norm."),
}


def freeze(model, groups: list[str]) -> list[str]:
    """Set requires_grad False on the named module groups; return the frozen parameter names.
    With tied embeddings, freezing either embeddings or lm_head freezes the shared matrix."""
    frozen = []
    for name, p in model.named_parameters():
        if any(pat in name or name.startswith(pat) for g in groups for pat in FREEZE_GROUPS[g]):
            p.requires_grad_(False)
            frozen.append(name)
    return frozen
