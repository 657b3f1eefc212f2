"""`mlstack-ds publish`: built wheels, with the plans they were built from, into a team's package index."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from mlstack_ds.cli.options import CacheDirOption, JsonOption, PublishToOption
from mlstack_ds.console import make_output, print_records
from mlstack_ds.install.publish import publish


def publish_command(
    wheels: Annotated[list[str], typer.Argument(
        metavar="WHEEL|KEY...", help="Wheels mlstack-ds built (the cache's, or `build --wheel-dir` copies), or "
        "cache keys.", show_default=False)],
    to: PublishToOption,
    cache_dir: CacheDirOption = None,
    json_output: JsonOption = False,
) -> None:
    """Publish built DeepSpeed wheels to a PEP 503 index in a directory, each beside its plan.

    Serve DIR with any static web server (or copy it to a bucket) and install elsewhere with
    `mlstack-ds install --index http://HOST/simple`; `pip install --index-url http://HOST/simple
    deepspeed==VERSION` takes the exact wheel too. Publishing again is a no-op.
    """
    output = make_output(json_output)
    done = publish(wheels, to, cache_dir, status=output.status)
    if json_output:
        output.emit_json({"index": str(to / "simple"), "wheels": [p.to_json() for p in done]})
        return
    print_records(output.out, ("wheel", "version", "action"),
                  [(p.wheel.name, p.version, p.action) for p in done], title="published")
    output.out.print(f"index: {escape(str(to / 'simple'))} (serve {escape(str(to))}; "
                     "install --index http://HOST/simple)")


def register(app: typer.Typer) -> None:
    app.command("publish")(publish_command)


__all__ = ["register"]
