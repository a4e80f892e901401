"""CLI commands of the web app: `assay app`, `assay export-space`, `assay catalog refresh`."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Optional

import typer

from assay.core.cli import json_option
from assay.core.errors import AssayError


def check_port_free(host: str, port: int) -> None:
    if not 0 < port < 65536:
        raise AssayError(f"--port must be between 1 and 65535, got {port}")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free; a listener is not
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise AssayError(f"cannot serve on {host}:{port} ({exc.strerror or exc}): is the port in use?") from None


def register(app: typer.Typer) -> None:
    catalog_app = typer.Typer(no_args_is_help=True, help="The catalog of public models the app lists (Selected, Trending, Downloads).")
    app.add_typer(catalog_app, name="catalog")

    @app.command("app")
    def serve_app(
        folder: Path = typer.Argument(..., help="results folder (one Parquet file per stack)"),
        catalog: Optional[Path] = typer.Option(None, "--catalog", help="catalog file (default: FOLDER/catalog.json, else the zoo's stand-ins)"),
        port: int = typer.Option(7860, help="port to serve on"),
        host: str = typer.Option("127.0.0.1", help="address to serve on (0.0.0.0 for every interface)"),
    ):
        """Serve the read-only web app over a results folder (Gradio)."""
        from assay.app.catalog import resolve_catalog
        from assay.compat.dataset import check_results

        folder = check_results(folder)
        chosen = resolve_catalog(folder, catalog)
        check_port_free(host, port)
        from assay.app.ui import build_app, launch_options

        demo = build_app(folder, chosen)
        typer.echo(f"assay app: {folder} on http://{host}:{port} (catalog: {chosen.source}); Ctrl+C stops it", err=True)
        try:
            demo.launch(**launch_options(host, port))
        except OSError as exc:  # the port was taken between the check and the bind
            raise AssayError(f"cannot serve on {host}:{port}: {exc}") from None

    @app.command("export-space")
    def export_space_command(
        out: Path = typer.Argument(..., help="folder to write the Space into (new, empty, or a previous export)"),
        results: Path = typer.Option(..., "--results", help="results folder to publish"),
        catalog: Optional[Path] = typer.Option(None, "--catalog", help="catalog file (default: RESULTS/catalog.json, else the zoo's stand-ins)"),
        title: str = typer.Option("assay results", help="the Space's title"),
        json_out: bool = json_option(),
    ):
        """Write a folder that runs as-is as a Hugging Face Space (app.py, requirements.txt, README.md, data/)."""
        from assay.app.catalog import resolve_catalog
        from assay.app.space import check_out, export_space
        from assay.compat.dataset import check_results
        from assay.core.output import print_json, print_key_values

        check_results(results)
        check_out(out)  # refuse a foreign folder before the default catalog's slow import of the zoo
        chosen = resolve_catalog(results, catalog)
        export = export_space(out, results, chosen, title=title)
        record = {"folder": str(export.folder), "stacks": export.stacks, "rows": export.rows, "files": export.files}
        if json_out:
            print_json(record)
        else:
            print_key_values(record | {"files": len(export.files), "run": f"cd {export.folder} && python app.py"}, title="Space written")

    @catalog_app.command("refresh")
    def catalog_refresh(
        task: str = typer.Option("text-generation", help="the Hub's pipeline tag"),
        out: Path = typer.Option(Path("catalog.json"), help="catalog file to update (its selected list is kept)"),
        limit: int = typer.Option(50, help="models per ranking (downloads, trending)"),
        from_file: Optional[Path] = typer.Option(None, "--from-file", help="a recorded list_models response instead of the Hub"),
        json_out: bool = json_option(),
    ):
        """Fill the catalog's Trending and Downloads rankings from the Hub's model listing."""
        from assay.app.catalog import catalog_from_dict, load_catalog, recorded_list_models, refresh_catalog, save_catalog
        from assay.core.output import print_json, print_table

        existing = None
        if out.exists():
            existing = load_catalog(out)  # a bad file stops here, before anything is fetched or overwritten
            if existing.source == "zoo":
                raise AssayError(f"{out} is a zoo's catalog (it lists the zoo's entries); write the app's catalog elsewhere with --out")
        list_models = recorded_list_models(from_file) if from_file else None
        refreshed = refresh_catalog(task, limit, list_models=list_models, existing=existing)
        catalog_from_dict(refreshed.as_dict())  # what we write must read back
        save_catalog(refreshed, out)
        ranked = sorted((m for m in refreshed.models if m.task == task and m.downloads is not None), key=lambda m: -m.downloads)
        rows = [{"id": m.id, "downloads": m.downloads, "likes": m.likes, "trending_score": m.trending_score} for m in ranked]
        if json_out:
            print_json({"out": str(out), "task": task, "models": rows})
        else:
            print_table(rows, ["id", "downloads", "likes", "trending_score"], title=f"{out}: {len(rows)} {task} models by downloads")
