"""The commands of the command line, one module each.

A command module has ``register(commands)``, which adds its subparser to the top-level
parser's subcommands and sets ``handler`` (``args -> exit code``) as its default. Only
the standard library is imported at module level, as in ``harness.cli``: building the
parser for ``harness --help`` must stay well under 100 ms. A handler imports what it
needs when it runs, from ``harness`` (the public API) or ``harness.client`` (the daemon
client, standard library only) and nothing else of ours.

Adding a command: write ``harness/commands/<name>.py`` with ``register`` and its handler,
and list the module in ``harness.cli.COMMANDS``.
"""
