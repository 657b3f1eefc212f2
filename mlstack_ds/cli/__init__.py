"""The typer CLI: one module per command group; `app.main` is the entry point."""
