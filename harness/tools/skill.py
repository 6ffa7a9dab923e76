"""skill: load a skill's instructions (DESIGN §12, the Agent Skills format).

The description the model sees lists every skill of the session by name and description
(``skill_description``, built per turn by the turn builder); calling ``skill {name}``
returns the body of that skill's ``SKILL.md`` and its folder, so the model can read the
files it ships with ``read`` and run its scripts with ``bash`` (gated as ever).

The name is untrusted: it is only ever looked up in the discovered list (harness/skills.py),
never joined to a path, so ``../x`` or a name not in the list is refused with the list.
Permission ``skill`` with the skill's name as the pattern, allowed by default.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio
from pydantic import Field

from harness.frontmatter import FrontMatterError
from harness.skills import MAX_DESCRIPTION, Skill, discover, skill_body
from harness.tools.base import (
    PermissionNeed,
    Tool,
    ToolContext,
    ToolFailure,
    ToolOutput,
    ToolParams,
)


class SkillParams(ToolParams):
    name: str = Field(description="The skill's name, as listed in this tool's description")


class SkillTool(Tool[SkillParams]):
    name = "skill"
    description = (
        "Load a skill: instructions (and often scripts or reference files) for a kind of "
        "task. When a task matches a skill's description, load it before you start and "
        "follow it. The result gives the skill's instructions and its folder; read the "
        "files it mentions from there."
    )
    params = SkillParams
    read_only = True  # it only reads a file: safe to run again after a restart

    def permissions(self, args: SkillParams, ctx: ToolContext) -> list[PermissionNeed]:
        return [PermissionNeed("skill", args.name, args.name)]

    def title(self, args: SkillParams) -> str:
        return f"skill {args.name[:80]}"

    async def execute(self, args: SkillParams, ctx: ToolContext) -> ToolOutput:
        skills, _ = await trio.to_thread.run_sync(discover, ctx.directory)
        chosen = next((skill for skill in skills if skill.name == args.name), None)
        if chosen is None:
            offered = ", ".join(skill.name for skill in skills) or "(none)"
            raise ToolFailure(f"unknown skill {args.name[:100]!r}; available skills: {offered}")
        try:
            body = await trio.to_thread.run_sync(skill_body, chosen)
        except FrontMatterError as error:
            raise ToolFailure(f"the skill {chosen.name} cannot be read: {error}") from None
        output = (
            f'<skill name="{chosen.name}">\n{body}\n</skill>\n\n'
            f"The skill's folder: {chosen.folder}\n"
            "Paths in the instructions are relative to it."
        )
        return ToolOutput(
            output=output,
            title=f"skill {chosen.name}",
            metadata={"name": chosen.name, "folder": chosen.folder},
        )


def skill_description(skills: Iterable[Skill]) -> str:
    """The skill tool's description with the session's skills listed, name: description."""
    lines = []
    for skill in skills:
        text = skill.description
        if len(text) > MAX_DESCRIPTION:
            text = text[: MAX_DESCRIPTION - 1] + "…"
        lines.append(f"- {skill.name}: {text}")
    return SkillTool.description + "\n\nAvailable skills (the name argument):\n" + "\n".join(lines)
