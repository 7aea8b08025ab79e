"""Compile the pipeline to ``compiled/llm_finetune.yaml`` (the file users upload in the KFP UI), and write what else
derives from the settings model (pipelines/derive.py: the validate_inputs component, docs/settings.md's settings table).

    python -m pipelines.compile            # write them
    python -m pipelines.compile --check    # exit 1 and show the difference when a checked-in file is stale
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

import yaml
from kfp import compiler

from components.version import pin_errors
from pipelines.derive import derived_files

COMPILED = Path(__file__).resolve().parents[1] / "compiled" / "llm_finetune.yaml"


def compile_pipeline(path: Path, variants_parallel: int = 1) -> Path:
    """Compile the cluster variant of the pipeline to ``path``, training at most ``variants_parallel`` variants at
    once (compiled/ holds 1; ``python -m pipelines.run --host`` compiles with the run's value)."""
    # Not at module level: main() first rewrites components/validate/component.py (derived from the settings
    # model), and the pipeline embeds that file's source when it is imported.
    from pipelines.llm_finetune import build_pipeline

    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline("cluster", variants_parallel=variants_parallel), str(path))
    return path


def same_pipeline(a: str, b: str) -> bool:
    """Whether two compiled YAML texts hold the same documents.

    KFP's header comment lists dict defaults in an unstable key order, so text equality would call
    an unchanged pipeline stale; the documents themselves are what KFP reads.
    """
    return list(yaml.safe_load_all(a)) == list(yaml.safe_load_all(b))


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m pipelines.compile``."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.compile", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the checked-in YAML differs from the source")
    parser.add_argument("--output", type=Path, default=COMPILED, help=f"where to write (default {COMPILED})")
    args = parser.parse_args(argv)
    for error in pin_errors():
        print(f"error: {error}", file=sys.stderr)
        return 2
    # Before the pipeline is imported: the compiled YAML embeds the validate_inputs component's source.
    stale = []
    # Only the repository's own build rewrites its derived files: a pinned or private build elsewhere leaves them.
    derived = derived_files() if args.output.resolve() == COMPILED else {}
    for path, text in derived.items():
        if path.read_text() == text:
            continue
        if args.check:
            sys.stdout.writelines(
                difflib.unified_diff(
                    path.read_text().splitlines(True),
                    text.splitlines(True),
                    str(path),
                    "derived from the settings model",
                )
            )
            stale.append(path)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"\n{', '.join(map(str, stale))} stale: run `python -m pipelines.compile` and commit", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        fresh = compile_pipeline(Path(tmp) / "llm_finetune.yaml").read_text()
    current = args.output.read_text() if args.output.exists() else ""
    if current and same_pipeline(fresh, current):
        print(f"{args.output} is up to date")
        return 0
    if not args.check:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(fresh)
        print(f"wrote {args.output}")
        return 0
    sys.stdout.writelines(
        difflib.unified_diff(current.splitlines(True), fresh.splitlines(True), str(args.output), "compiled from source")
    )
    print(f"\n{args.output} is stale: run `python -m pipelines.compile` and commit it", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
