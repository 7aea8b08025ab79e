"""The optional push of the exported model to a Hugging Face Hub repository (``hub_repo_id``).

``push_to_hub`` makes one commit of the export folder (``<output_dir>/final``, components/train/trainer/export.py)
into a model repository, with ``huggingface_hub``: ``create_repo`` then ``upload_folder``. The choices:

- Private by default. A repository that does not exist is created private unless ``private=False``. One that exists
  is reused, a new commit on top of what it holds, and keeps its visibility: this function never makes a repository
  public. Nor does it push a private run into a public one: with ``private=True`` an existing public repository is
  refused (a public push is asked for with ``private=False``).
- Only the model: the files ``export_final`` writes, at the folder's top level (``PUSHED_FILES``), so a checkpoint
  folder, the optimizer state or a half-written shard (``*.partial``) beside them never leaves the cluster.
- The token comes from a Secret (``hub_token_secret``): the caller reads it from the step's environment and passes
  it here. It is sent only as the bearer token of the Hub's API, never logged, never put in an error message.
- ``endpoint`` is the Hub's address: a team's Hub mirror or proxy, as ``HF_ENDPOINT`` names one (None: that variable,
  else https://huggingface.co).
- How the weights travel is huggingface_hub's choice: with ``hf_xet`` installed (a dependency of huggingface_hub on
  x86_64 and arm64) over the Xet protocol, as the Hub stores them; otherwise, or with ``HF_HUB_DISABLE_XET=1`` (a
  mirror without Xet storage: the push says so in one line), over the Git LFS batch API. An interrupted push is
  resumed by running it again: files the repository already holds unchanged are skipped (a push of an unchanged
  folder makes no commit and returns the URL of the commit that holds it).
- The errors a user can fix are one line naming the setting to change: a malformed ``hub_repo_id`` (huggingface_hub's
  own ``validate_repo_id``, before any request), a token the Hub refuses (401) or one that may not write there (403):
  ``hub_token_secret``.
"""

from __future__ import annotations

import fnmatch
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from components.version import __version__

if TYPE_CHECKING:
    from huggingface_hub.errors import HfHubHTTPError

log = logging.getLogger("publish.hub")

# What export_final (components/train/trainer/export.py) writes into final/, by name; matched against paths relative
# to the folder (huggingface_hub's filter_repo_objects: fnmatch, whose * also crosses "/", hence TOP_LEVEL_ONLY).
PUSHED_FILES = (
    # Weights: model.safetensors, or model-00001-of-00003.safetensors... with their index; adapter_model.safetensors
    # for a LoRA run exported without merge_lora.
    "*.safetensors",
    "model.safetensors.index.json",
    # The model's configuration (a merged or full model), generation defaults, the adapter's configuration.
    "config.json",
    "generation_config.json",
    "adapter_config.json",
    # tokenizer.save_pretrained: tokenizer.json, tokenizer_config.json, chat_template.jinja for the fast tokenizers the
    # package trains (Qwen3's); the others for tokenizer classes that write them.
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    # The run's own card (base model, method, data, metrics) and a model card: PEFT writes one beside an adapter.
    "model.json",
    "README.md",
)
# Nothing below the folder's top level: checkpoint-<step>/, DeepSpeed's global_step<n>/, runs/ are not the model.
TOP_LEVEL_ONLY = ("*/*",)


def check_repo_id(repo_id: str) -> None:
    """A ValueError, one line naming ``hub_repo_id``, unless ``repo_id`` is ``<namespace>/<name>`` as the Hub takes it.

    The namespace is required: without one the Hub would create the repository in the token owner's account, wherever
    that is.
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise ValueError(f"hub_repo_id={repo_id!r} is not a Hub repository id: {e}") from None
    if "/" not in repo_id:
        raise ValueError(
            f"hub_repo_id={repo_id!r} names no namespace: write <user or organization>/{repo_id}, the account the "
            "model goes to"
        )


def files_to_push(folder: str) -> list[str]:
    """The files of ``folder`` that ``push_to_hub`` sends (``PUSHED_FILES`` at its top level), sorted; a ValueError
    when the folder holds no model (no config.json or adapter_config.json, or no safetensors weights)."""
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"{folder} is not a folder: nothing to push to the Hub")
    names = sorted(
        p.name
        for p in path.iterdir()
        if p.is_file() and any(fnmatch.fnmatchcase(p.name, pattern) for pattern in PUSHED_FILES)
    )
    if not {"config.json", "adapter_config.json"} & set(names) or not any(n.endswith(".safetensors") for n in names):
        raise ValueError(
            f"{folder} holds no exported model (config.json or adapter_config.json, and safetensors weights): "
            "not pushed to the Hub"
        )
    return names


def push_to_hub(
    *,
    folder: str,
    repo_id: str,
    token: str,
    private: bool = True,
    revision: str = "main",
    commit_message: str,
    endpoint: str | None = None,
) -> str:
    """Push the exported model in ``folder`` to the Hub model repository ``repo_id`` as one commit on ``revision``
    (created from main when it is another branch that does not exist); the commit's URL.

    The choices (private by default, existing repositories reused and never made public, the files pushed, the token)
    are the module docstring's. Errors: a ValueError, one line, for a malformed ``repo_id`` (before any request), an
    empty token, a folder without a model, offline mode (``HF_HUB_OFFLINE``), a token the Hub refuses (401) or one that
    may not write to ``repo_id`` (403), and an existing public repository with ``private=True``; huggingface_hub's own
    errors for the rest (the Hub unreachable, a server error).
    """
    check_repo_id(repo_id)
    if not token:
        raise ValueError(
            "hub_token_secret: no Hub token in the step's environment (the Secret it names is empty or lacks the key); "
            "put a Hugging Face access token with write access in it"
        )
    names = files_to_push(folder)

    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError

    if constants.is_offline_mode():
        raise ValueError("HF_HUB_OFFLINE=1 forbids the push to the Hub: unset it in this step's environment")
    api = HfApi(endpoint=endpoint, token=token, library_name="kubeflow-llm-post-training", library_version=__version__)
    where = f"{api.endpoint}/{repo_id}"
    log.info(
        "pushing %d files of %s to %s (%s), revision %s",
        len(names),
        folder,
        where,
        "private" if private else "public",
        revision,
    )
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if private and not api.repo_info(repo_id, repo_type="model").private:
            raise ValueError(
                f"hub_repo_id={repo_id!r} is a public repository at {api.endpoint} and the push is private: name "
                "another repository, make this one private on the Hub, or push with private=False"
            )
        if revision != constants.DEFAULT_REVISION:
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            repo_type="model",
            revision=revision,
            commit_message=commit_message,
            allow_patterns=list(PUSHED_FILES),
            ignore_patterns=list(TOP_LEVEL_ONLY),
        )
    except HfHubHTTPError as e:
        if problem := _refusal(e, repo_id, api.endpoint, token):
            raise ValueError(problem) from None
        raise
    except ConnectionError as e:  # hf_xet's errors: a Hub without Xet storage answers 404 for the Xet write token
        if "xet-write-token" in str(e) and "404" in str(e):
            raise ValueError(
                f"{api.endpoint} offers no Xet storage (HTTP 404 for the Xet write token), which huggingface_hub uses "
                "for the weights when hf_xet is installed: set HF_HUB_DISABLE_XET=1 in this step's environment to "
                "push them over Git LFS"
            ) from None
        raise
    log.info("pushed to %s: %s", where, commit.commit_url)
    return commit.commit_url


def _refusal(error: HfHubHTTPError, repo_id: str, endpoint: str, token: str) -> str | None:
    """The one line a user can act on for a refused token (401) or a forbidden write (403); None for other errors.

    Raised ``from None``: huggingface_hub's message spans lines (request id, URL, hints); the server's own words stay,
    with the token (never there, but it is checked) masked.
    """
    status = error.response.status_code if error.response is not None else None
    said = " ".join(str(error.server_message or "").split()).replace(token, "***")
    said = f": {said}" if said else ""
    if status == 401:
        return (
            f"hub_token_secret: {endpoint} refused the Hub token (HTTP 401{said}); put a valid Hugging Face access "
            "token with write access in the Secret hub_token_secret names"
        )
    if status == 403:
        namespace = repo_id.split("/")[0]
        return (
            f"hub_token_secret: the Hub token may not write to hub_repo_id={repo_id!r} (HTTP 403{said}); give the "
            f"Secret a token with write access to {namespace!r} (a fine-grained token needs write on that namespace "
            "or repository), or name a hub_repo_id it can write to"
        )
    return None
