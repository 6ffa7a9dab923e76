"""An MCP result as the text the model reads (DESIGN §12).

Text is kept as is. What the model cannot read as text is named with its type and size,
so it knows the tool answered and with what: ``[image: image/png, 91 bytes]``. An embedded
resource's text is shown under its URI; a binary one is named. ``structuredContent`` is
shown as JSON when no text block came with it (the spec asks servers to send the value
as text too).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import mcp.types as mt


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)


def _resource(contents: mt.TextResourceContents | mt.BlobResourceContents) -> str:
    mime = contents.mime_type or "unknown type"
    if isinstance(contents, mt.TextResourceContents):
        return f"[resource: {contents.uri} ({mime})]\n{contents.text}"
    return f"[resource: {contents.uri} ({mime}), {_decoded_size(contents.blob)} bytes, binary]"


def content_text(block: Any) -> str:
    """One content block as text."""
    if isinstance(block, mt.TextContent):
        return block.text
    if isinstance(block, mt.ImageContent):
        return f"[image: {block.mime_type}, {_decoded_size(block.data)} bytes]"
    if isinstance(block, mt.AudioContent):
        return f"[audio: {block.mime_type}, {_decoded_size(block.data)} bytes]"
    if isinstance(block, mt.ResourceLink):
        described = f": {block.description}" if block.description else ""
        return f"[resource link: {block.uri} ({block.mime_type or 'unknown type'}){described}]"
    if isinstance(block, mt.EmbeddedResource):
        return _resource(block.resource)
    kind = getattr(block, "type", type(block).__name__)
    return f"[{kind} content]"


def result_text(result: mt.CallToolResult) -> str:
    """The whole result: its blocks in order, then its structured content if it is new."""
    texts = [content_text(block) for block in result.content]
    structured = result.structured_content
    # A server is asked to send the same value as text too, and many wrap their text in
    # {"result": ...} besides: shown only when no text block came with it.
    texts_given = any(isinstance(b, mt.TextContent | mt.EmbeddedResource) for b in result.content)
    if structured is not None and not texts_given:
        texts.append("structured content:\n" + json.dumps(structured, indent=2, default=str))
    return "\n".join(texts) if texts else "(the tool returned no content)"


def read_text(result: mt.ReadResourceResult) -> str:
    """A ``resources/read`` answer as text."""
    return "\n".join(_resource(c) for c in result.contents) or "(the resource is empty)"
