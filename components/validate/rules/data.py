"""The data step's rules: sources, the sft stage's format and the held-out split; and, for a local run, each local
source's files and the columns of their first row against the stage's format and column mapping."""

from __future__ import annotations

import json

from components.data.formats import REQUIRED, check_columns, detect_format
from components.data.peek import SourceError, first_columns, local_files
from components.settings import Settings
from components.stages import STAGE_DATA


def check_data_settings(s: Settings) -> list[str | None]:
    """A training source; a chat or text format for the sft data; a held-out fraction or count; a cpt chunk overlap
    below the chunk length (the threshold's range, and the overlap's floor, are the settings model's bounds)."""
    d = s.data
    errors: list[str | None] = []
    if not d.dataset_source.strip():
        errors.append(
            "dataset_source is empty; give builtin:sample, a file/folder/glob, pvc://claim/path or a Hub dataset id"
        )
    if d.dataset_format == "preference":
        errors.append(
            "dataset_format=preference: preference pairs are the dpo stage's data; put them in "
            'dpo_dataset_source and add "dpo" to stages (dataset_source is the sft stage\'s chat data)'
        )
    if d.dataset_format == "prompts":
        errors.append(
            "dataset_format=prompts: prompts with reference answers are the grpo stage's data; put them in "
            'grpo_dataset_source and add "grpo" to stages (dataset_source is the sft stage\'s chat data)'
        )
    if d.eval_size <= 0 or (d.eval_size >= 1 and d.eval_size != int(d.eval_size)):
        errors.append(f"eval_size={d.eval_size} must be a fraction in (0, 1) or a whole number of conversations")
    if d.cpt_chunk_overlap >= s.train.max_seq_length:
        # Each chunk must bring at least one new token: an overlap of max_seq_length would repeat a chunk forever.
        errors.append(
            f"cpt_chunk_overlap={d.cpt_chunk_overlap} must be below max_seq_length={s.train.max_seq_length} (the "
            "chunk length: each chunk repeats that many tokens of the one before it as context); lower it, e.g. to "
            f"{s.train.max_seq_length // 8}, or 0"
        )
    return errors + _claim_errors(s) + _source_errors(s, local=s.job.train_backend == "local")


def _stage_sources(s: Settings) -> dict[str, str]:
    """Each source setting the run reads -> the stage whose format and column mapping its rows must fit: the sft
    data always (evaluation scores its held-out split), eval_source with it, and each other stage's own."""
    read = {"dataset_source": "sft", "eval_source": "sft"}
    for stage in s.stages.stages:
        read.setdefault(STAGE_DATA.get(stage, ("dataset_source",))[0], stage)
    return read


def _sources(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def _claim_errors(s: Settings) -> list[str | None]:
    """pvc:// sources on the data claim: the only claim the data step mounts."""
    values, claim = s.flat(), s.storage.data_pvc
    return [
        f"{setting}={values[setting]!r}: {source!r} is on claim {source[6:].partition('/')[0]!r}, but the data step "
        f"mounts only data_pvc={claim!r}; put the data on it, or set data_pvc to that claim"
        for setting in _stage_sources(s)
        for source in _sources(values[setting])
        if source.startswith("pvc://") and source[6:].partition("/")[0] != claim
    ]


def _source_errors(s: Settings, *, local: bool) -> list[str | None]:
    """The sources this pod can read now: the bundled samples (``builtin:``, in the package here as in the image)
    always, and a ``local`` run's paths on this machine. Each path must name files, and the first row of each
    source's first file must have the columns its column mapping names and its format needs (what the data step
    would fail on a minute later, after loading the tokenizer; a mapping onto a column the bundled sample lacks would
    otherwise be ignored). Hub ids, pvc://, s3:// and gs:// sources, and a cluster run's paths, are the data step's
    to read; the rows past the first are too (broken ones: max_bad_rows)."""
    from components.data.run import COLUMN_MAPPINGS, stage_options
    from components.data.samples import BUILTIN, builtin_path

    values = s.flat()
    errors: list[str | None] = []
    for setting, stage in _stage_sources(s).items():
        names, fmt = stage_options(stage), STAGE_DATA[stage][1] or s.data.dataset_format
        mapping = values[COLUMN_MAPPINGS[stage]] if stage in COLUMN_MAPPINGS else {}
        readable = {c for columns in REQUIRED.values() for c in columns} | {"input", "system", "answer"}
        unreadable = fmt not in ("auto", *REQUIRED) or (stage == "sft" and fmt in ("preference", "prompts"))
        if unreadable or set(mapping) - readable:
            continue  # a format or mapping the stage cannot read: its own error says so
        for source in _sources(values[setting]):
            builtin = source in BUILTIN  # another builtin: name is checked with the stage's sources
            if source.startswith(("pvc://", "hf://", "s3://", "gs://")) or not (local or builtin):
                continue  # the data step reads these
            try:
                files = [builtin_path(source)] if builtin else local_files(source)
                first = files[0] if isinstance(files, list) else None  # not a Hub id, nor a saved dataset
                columns = first_columns(first) if first else None
            except (SourceError, OSError) as e:
                which = "" if values[setting].strip() == source else f"{source!r}: "
                errors.append(f"{setting}={values[setting]!r}: {which}{str(e).removeprefix(f'source {source!r}: ')}")
                continue
            if first is None or columns is None:  # a Hub id, a saved dataset, a first line too long to peek at
                continue
            absent = {ours: theirs for ours, theirs in mapping.items() if theirs not in columns}
            if absent:
                ours, theirs = next(iter(absent.items()))
                errors.append(
                    f"{names.columns}={json.dumps(mapping)}: maps {ours!r} onto column {theirs!r}, which {first} "
                    f"does not have (its first row's columns: {columns}); name one of them"
                )
                continue
            renamed = [{theirs: ours for ours, theirs in mapping.items()}.get(c, c) for c in columns]
            try:
                if fmt == "auto":
                    detect_format(renamed, f"{setting}: {first}", names)
                else:
                    check_columns(fmt, renamed, f"{setting}: {first}", names)
            except ValueError as e:
                errors.append(str(e))
    return errors
