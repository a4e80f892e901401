"""`assay stack` and `assay cache export|import`: the stack fingerprint and the compile cache, both core's own."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from assay.core.cli import backend_option, device_option, json_option


def stack_command(
    device: str = device_option(help="device type to describe"),
    backend: str = backend_option(help="torch.compile backend whose compiler is recorded"),
    json_out: bool = json_option(),
):
    """The software/hardware fingerprint results are recorded under, and its stack_id."""
    from assay.core.device import resolve_backend, resolve_device
    from assay.core.output import print_json, print_key_values
    from assay.core.stack import collect_stack

    stack_info = collect_stack(resolve_device(device).type, resolve_backend(backend))
    record = stack_info.as_dict()
    if json_out:
        print_json(record)
        return
    flat = {"stack_id": record["stack_id"], "label": record["label"], "python": record["python"]}
    flat |= {f"lib {k}": v for k, v in record["libraries"].items()}
    flat |= {f"compiler {k}": v for k, v in record["compiler"].items()}
    flat |= {f"vendor {k}": v for k, v in record["vendor_packages"].items()}
    flat |= {"device": f"{record['device_type']} x{record['device_count']} ({record['device_name']})", "os": record["os"]}
    print_key_values(flat, title="assay stack")


def cache_export_command(
    archive: Path = typer.Argument(..., help="the .tar.gz to write"),
    cache_dir: Optional[Path] = typer.Option(None, help="cache folder (default: torch's inductor cache folder)"),
    device: str = device_option(help="device type the cache was built for"),
    json_out: bool = json_option(),
):
    """Write the compile cache to an archive labelled with the compiler versions it needs."""
    from assay.core.compile_cache import export_cache
    from assay.core.output import print_json, print_key_values

    info = export_cache(archive, cache_dir, device)
    print_json(info) if json_out else print_key_values({"archive": info["archive"], "files": info["files"], **info["fingerprint"]}, title="cache exported")


def cache_import_command(
    archive: Path = typer.Argument(..., help="an archive written by `assay cache export`"),
    cache_dir: Optional[Path] = typer.Option(None, help="cache folder (default: torch's inductor cache folder)"),
    device: str = device_option(help="device type of this machine's probes"),
    json_out: bool = json_option(),
):
    """Load a compile cache; refuses, clearly, one built by another stack."""
    from assay.core.compile_cache import import_cache
    from assay.core.output import print_json, print_key_values

    info = import_cache(archive, cache_dir, device)
    print_json(info) if json_out else print_key_values({"cache_dir": info["cache_dir"], "files": info["files"]}, title="cache imported")


def register(app: typer.Typer) -> None:
    app.command("stack")(stack_command)
    cache_app = typer.Typer(no_args_is_help=True, help="Compile caches, carried between machines of the same stack.")
    app.add_typer(cache_app, name="cache")
    cache_app.command("export")(cache_export_command)
    cache_app.command("import")(cache_import_command)
