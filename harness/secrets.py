"""Which environment variables are credentials: the one list every part of harness uses.

A command the model runs is untrusted: it must not be handed the provider key harness holds
(``echo $MISTRAL_API_KEY`` would put the key into the ledger, the cassette and the screen),
nor any other credential that happens to be in the user's environment. So every
subprocess a tool starts gets ``tool_environment()``: the environment minus the names
``credential_names()`` gives.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

# The keys harness itself reads (harness/providers/__init__.py).
CREDENTIAL_ENV_NAMES: tuple[str, ...] = ("MISTRAL_API_KEY", "OPENAI_API_KEY")

# Names that look like credentials, matched case-insensitively: removed from the tools'
# environment too, whoever set them (a GITHUB_TOKEN, a DB_PASSWORD). A hostile command has
# no more claim to those than to the provider key.
_SUFFIXES = ("_API_KEY", "_APIKEY", "_TOKEN", "_SECRET", "_SECRET_KEY", "_ACCESS_KEY")
_INFIXES = ("PASSWORD", "PASSWD")


def is_credential_name(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether the variable ``name`` holds a credential (``extra``: names from config)."""
    upper = name.upper()
    if upper in CREDENTIAL_ENV_NAMES or name in set(extra):
        return True
    return upper.endswith(_SUFFIXES) or any(part in upper for part in _INFIXES)


def credential_names(
    extra: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> list[str]:
    """The credential variables: the known ones, ``extra``, and those set in ``environ``
    (default ``os.environ``) whose names look like credentials."""
    env = os.environ if environ is None else environ
    extra = tuple(extra)
    names = set(CREDENTIAL_ENV_NAMES) | set(extra)
    names.update(name for name in env if is_credential_name(name, extra))
    return sorted(names)


def tool_environment(
    extra: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment a tool's subprocess gets: ``environ`` without any credential."""
    env = os.environ if environ is None else environ
    secret = set(credential_names(extra, env))
    return {name: value for name, value in env.items() if name not in secret}
