"""``sidecar settings``: the settings a process on this machine would run with.

For operators: which of defaults, secret files and environment variables won, without
reading them one by one. Secrets print as ``**********``, and a password inside a URL as
``***``: the output is safe to paste into a ticket.
"""

from __future__ import annotations

import json

import click

from sidecar.cli._root import main


@main.command("settings")
def settings_command() -> None:
    """Print the effective settings as JSON, secrets masked.

    Defaults, secret files in SIDECAR_SECRETS_DIR and SIDECAR_<SECTION>__<FIELD>
    variables, merged as every command merges them. Settings that do not validate are one
    error line naming each field, as for every other command.
    """
    from sidecar.settings import load_settings, mask_url_password

    settings = load_settings()
    doc = settings.model_dump(mode="json")  # SecretStr fields dump as "**********"
    doc["redis"]["url"] = settings.redis.masked_url
    if doc["explain"].get("base_url"):
        doc["explain"]["base_url"] = mask_url_password(doc["explain"]["base_url"])
    click.echo(json.dumps(doc, indent=2))
