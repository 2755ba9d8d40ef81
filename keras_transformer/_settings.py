"""Shared by the settings dataclasses (`GenerationConfig`, `Recipe`)."""

import dataclasses


def replace_settings(settings, overrides, what, error=ValueError):
    """``dataclasses.replace(settings, **overrides)``, raising ``error``
    that names the unknown keys and the known ones instead of a bare
    TypeError from the constructor."""
    fields = sorted(f.name for f in dataclasses.fields(settings))
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise error(f"Unknown {what} {unknown}; the settings are {fields}.")
    return dataclasses.replace(settings, **overrides)
