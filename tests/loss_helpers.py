"""`policy_loss(name, logp, old_logp, advantages, mask, **kw)`: a registered loss called
through `compute_policy_loss` with its `LossInputs` built from keywords (normalisers,
structure and importance weights by name, the rest the loss's options)."""

from policyopt.core import compute_policy_loss
from policyopt.core.losses import LossInputs, Normalisers

NORMALISERS = ("global_tokens", "global_seqs", "max_len")
STRUCTURE = ("segment_ids", "entropies")


def policy_loss(name, logp, old_logp, advantages, mask, agg=None, **kw):  # noqa: ANN001, ANN201
    norms = {k: kw.pop(k) for k in NORMALISERS if k in kw}
    structure = {k: kw.pop(k) for k in STRUCTURE if k in kw and kw[k] is not None}
    for k in STRUCTURE:
        kw.pop(k, None)
    if agg is not None:
        kw["agg"] = agg
    inputs = LossInputs(
        logp,
        old_logp,
        advantages,
        mask,
        normalisers=Normalisers(**norms),
        is_weights=kw.pop("is_weights", None),
        structure=structure,
    )
    return compute_policy_loss(name, inputs, **kw)
