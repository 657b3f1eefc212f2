"""`mlstack-ds detect`: show what this machine and the target Python have."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def detect(
        json_output: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    ) -> None:
        """Report ROCm, GPUs, PyTorch and the relevant environment variables."""
        raise NotImplementedError
