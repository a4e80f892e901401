"""CLI commands of the web app: `assay app`, `assay publish`, `assay export-space`, `assay catalog refresh`."""

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
        folder: Path = typer.Argument(..., help="results folder (one Parquet file per stack), or a published dataset folder"),
        catalog: Optional[Path] = typer.Option(None, "--catalog", help="catalog file (default: FOLDER/catalog.json, else the zoo's stand-ins)"),
        port: int = typer.Option(7860, help="port to serve on"),
        host: str = typer.Option("127.0.0.1", help="address to serve on (0.0.0.0 for every interface)"),
    ):
        """Serve the read-only web app over a results folder (Gradio)."""
        from assay.app.catalog import resolve_catalog
        from assay.compat.results.dataset import check_results

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

    @app.command("publish")
    def publish_command(
        out: Path = typer.Argument(..., help="folder to write the dataset repository into (new, empty, or a previous publish)"),
        results: Path = typer.Option(..., "--results", help="results folder (or a published folder) to publish"),
        catalog: Optional[Path] = typer.Option(None, "--catalog", help="catalog file (default: RESULTS/catalog.json, else the zoo's stand-ins)"),
        license_id: str = typer.Option("cc-by-4.0", "--license", help="the card's license field (a Hub license id)"),
        title: str = typer.Option("assay results", help="the dataset card's title"),
        push_to: Optional[str] = typer.Option(None, "--push", help="then upload it to this Hub dataset repository (owner/name; needs HF_TOKEN)"),
        private: bool = typer.Option(False, "--private", help="with --push: create the repository private"),
        json_out: bool = typer.Option(False, "--json"),
    ):
        """Write a results folder as a Hugging Face dataset repository (Parquet per stack, README.md card with one config per stack)."""
        from assay.app.publish import check_push, publish, push
        from assay.core.output import print_json, print_table

        token = check_push(push_to) if push_to else None  # a push that cannot happen stops before anything is written
        published = publish(out, results, catalog, license_id=license_id, title=title)
        pushed = push(published.folder, push_to, token, private=private) if push_to else None
        stacks = [{"stack": s.stack_id, "rows": s.rows, "PASS": s.passed, "failed": s.failed, "skipped": s.skipped,
                   "torch": s.torch, "transformers": s.transformers, "file": s.path} for s in published.stacks]
        if json_out:
            print_json({"folder": str(published.folder), "rows": published.rows, "stacks": stacks, "files": published.files,
                        "pushed": pushed})
            return
        print_table(stacks, ["stack", "rows", "PASS", "failed", "skipped", "torch", "transformers"],
                    title=f"{published.folder}: {published.rows} rows, {len(stacks)} configs")
        name = published.stacks[0].stack_id
        typer.echo(f'load: datasets.load_dataset("{published.folder}", name="{name}", split="train")')
        if pushed:
            typer.echo(f"pushed: {pushed}")

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
        from assay.compat.results.dataset import check_results
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
