"""What a decoded JSON value is, in the words an error message uses."""

from __future__ import annotations


def json_type(x: object) -> str:
    """The JSON name of a decoded value's type, with its article: ``"null"`` for None,
    ``"a boolean"`` for true, ``"a number"`` for 3 or 2.5, ``"a string"``, ``"an array"``,
    ``"an object"``; a Python type's name for anything else."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "a boolean"
    if isinstance(x, int | float):
        return "a number"
    if isinstance(x, str):
        return "a string"
    if isinstance(x, list):
        return "an array"
    if isinstance(x, dict):
        return "an object"
    return f"a {type(x).__name__}"
