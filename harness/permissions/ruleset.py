"""The permission rule engine (DESIGN §8): pure functions over ordered lists of rules.

A ruleset is a plain sequence of ``Rule``; order is priority, and the last matching rule
wins. Rulesets from different sources are merged by concatenation, lowest priority first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from harness.messages.model import PermissionAction, Rule
from harness.messages.permission import PermissionNeed
from harness.permissions.wildcard import could_match, match

# The tools that change files all answer to one permission, so one rule covers them.
_EDIT_TOOLS = frozenset({"write", "edit", "apply_patch"})
_ACTIONS: frozenset[str] = frozenset({"allow", "deny", "ask"})


def _rule(permission: str, action: PermissionAction, pattern: str = "*") -> Rule:
    return Rule(permission=permission, pattern=pattern, action=action)


# No `*` baseline: anything unlisted falls through to "ask". The entries that merely
# restate "ask" are kept so the defaults read as a complete policy.
DEFAULT_RULES: tuple[Rule, ...] = (
    *(
        _rule(name, "allow")
        for name in (
            "read",
            "glob",
            "grep",
            "list",
            "todoread",
            "todowrite",
            "task",
            "question",
            # Loading a skill reads its instructions; what it ships is run through bash.
            "skill",
        )
    ),
    # Secrets live in .env files; the example file is meant to be read.
    _rule("read", "ask", "*.env"),
    _rule("read", "ask", "*.env.*"),
    _rule("read", "allow", "*.env.example"),
    _rule("edit", "ask"),
    # Writing a repository's config or hooks is running commands (harness/tools/paths.py).
    _rule("git_internal", "ask"),
    _rule("bash", "ask"),
    # Whether a sandboxed command may reach the network. Never asked at a prompt: bash
    # checks it with the gate's answer alone, so "ask" means no network until a rule
    # (`--allow bash_network`, `--allow 'bash_network:curl *'`) or `--yes` allows it.
    _rule("bash_network", "ask"),
    _rule("webfetch", "ask"),
    _rule("external_directory", "ask"),
    _rule("doom_loop", "ask"),
)


def _applies(rule: Rule, pattern: str, opaque: bool, covers: str | None) -> bool:
    """Whether ``rule`` speaks for a subject (its permission already matches).

    An opaque subject could be anything: only a ``*`` allow rule covers it, and every deny
    or ask rule might be about it. A subject with ``covers`` meets every deny or ask rule
    that could match one of its possible values. Only allows need the text itself.
    """
    if rule.action == "allow":
        return rule.pattern == "*" if opaque else match(rule.pattern, pattern)
    if opaque:
        return True
    if match(rule.pattern, pattern):
        return True
    return covers is not None and could_match(rule.pattern, covers)


def evaluate(
    permission: str,
    pattern: str,
    rules: Sequence[Rule],
    *,
    opaque: bool = False,
    covers: str | None = None,
) -> tuple[PermissionAction, Rule | None]:
    """The action of the last rule for ``permission`` that applies; "ask" if none.

    ``opaque`` and ``covers`` describe a subject the text cannot pin down (see
    ``PermissionNeed``): then a rule applies if it could be about the subject.
    """
    for rule in reversed(rules):
        if match(rule.permission, permission) and _applies(rule, pattern, opaque, covers):
            return rule.action, rule
    return "ask", None


_STRICTNESS: dict[PermissionAction, int] = {"allow": 0, "ask": 1, "deny": 2}


def decide(
    permission: str,
    pattern: str,
    layers: Sequence[Sequence[Rule]],
    approvals: Sequence[Rule] = (),
    *,
    opaque: bool = False,
    covers: str | None = None,
) -> tuple[PermissionAction, Rule | None, bool]:
    """The strictest answer of every layer: ``(action, rule, approved)``.

    A session's own merged ruleset is the first layer; a child session adds its
    ancestors' rulesets as further layers, so a child is never allowed what a parent is
    denied (the parent is a ceiling). Stored "always" approvals can turn an ``ask`` into
    ``allow``, but never override a ``deny``: an approval given in one place must not
    defeat a rule that forbids the same thing elsewhere. ``opaque`` and ``covers`` are
    those of ``evaluate``.
    """
    strictest: tuple[PermissionAction, Rule | None, bool] | None = None
    for rules in layers:
        action, rule = evaluate(permission, pattern, rules, opaque=opaque, covers=covers)
        approved = False
        if action == "ask":
            granted, approval = evaluate(
                permission, pattern, approvals, opaque=opaque, covers=covers
            )
            if approval is not None and granted == "allow":
                action, rule, approved = "allow", approval, True
        if strictest is None or _STRICTNESS[action] > _STRICTNESS[strictest[0]]:
            strictest = (action, rule, approved)
    return strictest or ("ask", None, False)


def decide_need(
    need: PermissionNeed, layers: Sequence[Sequence[Rule]], approvals: Sequence[Rule] = ()
) -> tuple[PermissionAction, Rule | None, bool]:
    """``decide`` for one need, its ``opaque`` and ``covers`` included."""
    return decide(
        need.permission,
        need.pattern,
        layers,
        approvals,
        opaque=need.opaque,
        covers=need.covers,
    )


def merge(*rulesets: Sequence[Rule]) -> list[Rule]:
    """Concatenate rulesets given lowest priority first (defaults, agent, config, session)."""
    return [rule for ruleset in rulesets for rule in ruleset]


def permission_for_tool(tool_name: str) -> str:
    """The permission a tool's calls are checked under."""
    return "edit" if tool_name in _EDIT_TOOLS else tool_name


def parse_rule_flag(text: str, action: PermissionAction) -> Rule:
    """Parse a CLI rule such as ``bash:git *``, ``edit`` or ``read:src/*``."""
    if action not in _ACTIONS:
        raise ValueError(f"unknown permission action {action!r}: use allow, deny or ask")
    permission, colon, pattern = text.strip().partition(":")
    permission = permission.strip()
    pattern = pattern.strip() if colon else "*"
    if not permission:
        raise ValueError(f"rule {text!r} has no permission name: expected PERMISSION[:PATTERN]")
    if any(ch.isspace() for ch in permission):
        raise ValueError(
            f"rule {text!r}: permission name {permission!r} contains whitespace; "
            "expected PERMISSION[:PATTERN], e.g. 'bash:git *'"
        )
    if not pattern:
        raise ValueError(f"rule {text!r} has an empty pattern after ':'; omit the ':' for all")
    # `--deny write` should mean what the user thinks: write is checked as `edit`.
    return _rule(permission_for_tool(permission), action, pattern)


def disabled_tools(tool_names: Iterable[str], rules: Sequence[Rule]) -> set[str]:
    """Tools to hide from the model: the last rule for their permission is a blanket deny.

    Only the last rule matching the permission counts, whatever its pattern, so
    ``edit * deny`` followed by ``edit plans/* allow`` keeps the tool visible.
    """
    names = tuple(tool_names)
    # Each turn asks this of the same tools and, mostly, the same rules: the answer is
    # kept by their values (a rule's ``source`` does not change it).
    key = (names, tuple((r.permission, r.pattern, r.action) for r in rules))
    known = _HIDDEN.get(key)
    if known is None:
        found: set[str] = set()
        for name in names:
            permission = permission_for_tool(name)
            last = next((r for r in reversed(rules) if match(r.permission, permission)), None)
            if last is not None and last.pattern == "*" and last.action == "deny":
                found.add(name)
        if len(_HIDDEN) >= _HIDDEN_KEEP:
            _HIDDEN.clear()
        known = _HIDDEN[key] = frozenset(found)
    return set(known)


_HIDDEN_KEEP = 256  # rulesets remembered; past this, all are forgotten
_HIDDEN: dict[tuple[tuple[str, ...], tuple[tuple[str, str, str], ...]], frozenset[str]] = {}
