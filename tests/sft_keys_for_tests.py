"""`sft_cache_key` as it was before each of its later entries, frozen: the tests that check
earlier warm starts stay valid compare the key with these."""

import hashlib
import json


def earlier_sft_cache_key(config, *, segments: bool) -> str:  # noqa: ANN001
    """The key before it read the data's content; `segments`: with the entry for a task that
    masks environment text out of SFT (`Task.sft_segments` overridden), else before it."""
    from policyopt import __version__
    from policyopt.pipelines.quickstart import sft_seed
    from policyopt.tasks.base import Task, task_class

    segmented = segments and task_class(config.task.name).sft_segments is not Task.sft_segments
    payload = {
        "version": __version__,
        "model": config.model.name_or_path,
        "dtype": config.model.dtype,
        "chat": config.model.chat_template,
        "task": config.task.model_dump(mode="json"),
        "sft": config.sft.model_dump(mode="json"),
        "seed": sft_seed(config),
        **({"precision": config.model.precision} if config.model.precision != "fp32" else {}),
        **({"sft_segments": "environment_masked"} if segmented else {}),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
