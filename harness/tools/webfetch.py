"""The ``webfetch`` tool: fetch a URL and return it as markdown, plain text or HTML.

Limits: a 5 MB cap on the (decoded) body, read as a stream and cut there; a deadline of
``timeout`` seconds (default 30, at most 120) over the whole fetch, redirects included;
at most 5 redirects, each checked like the first request.

No SSRF through the agent
-------------------------
A model that can be talked into fetching ``http://169.254.169.254/`` or an admin page on
the user's LAN is a hole, so requests to loopback, link-local, private, unique-local,
multicast, unspecified and reserved addresses (anything not globally routable) are refused
unless the user allowed that host through the ``webfetch_private`` permission.

The check sits where the connection is made: a network backend for httpcore resolves the
host with ``trio.socket.getaddrinfo``, judges every address, and connects to the address it
judged. So a redirect hop is checked exactly like the first request, and a DNS answer that
changes between a check and the connect (DNS rebinding) cannot slip through.

``permissions()`` may not do DNS, and ``execute`` cannot see the rules, so the two meet
through the validated arguments: when the arguments are validated the tool decides, without
DNS, whether the URL's host needs ``webfetch_private``, and records that on the arguments.
``permissions()`` then asks for the need, and ``execute`` allows private addresses for that
host only, because the executor never runs ``execute`` before every need was granted. The
host needs it when it is:

- an IP literal in a refused range, ``localhost`` or a ``*.localhost`` name; or
- a DNS name this process already saw resolve to a refused address.

The first fetch of a DNS name that resolves to a private address is therefore refused,
naming the rule that allows it (``--allow webfetch_private:HOST``); the host is remembered,
and the next call for it asks for ``webfetch_private`` (answered silently by such a rule).
Only the URL's own host is allowed: a redirect to another private host is refused.

httpx is told not to use proxy settings from the environment: through a proxy, the address
connected to would be the proxy's, and the check would judge the wrong host.
"""

from __future__ import annotations

import codecs
import contextlib
import ipaddress
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import urljoin, urlsplit

import trio
from pydantic import Field, PrivateAttr, field_validator

from harness.tools.base import (
    PermissionNeed,
    Tool,
    ToolContext,
    ToolFailure,
    ToolOutput,
    ToolParams,
)
from harness.tools.read import looks_binary

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    import httpx
    from bs4 import BeautifulSoup

MAX_RESPONSE_BYTES = 5 * 1024 * 1024
DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 120.0
MAX_REDIRECTS = 5
USER_AGENT = "Mozilla/5.0 (compatible; harness-webfetch/0.1)"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_ACCEPT = {
    "markdown": "text/markdown;q=1.0, text/html;q=0.9, text/plain;q=0.8, */*;q=0.1",
    "text": "text/plain;q=1.0, text/markdown;q=0.9, text/html;q=0.8, */*;q=0.1",
    "html": "text/html;q=1.0, application/xhtml+xml;q=0.9, text/plain;q=0.8, */*;q=0.1",
}
# Parts of a page that are code or chrome, not content.
_DROP_TAGS = ["script", "style", "noscript", "iframe", "object", "embed", "template", "svg"]
_BLOCK_TAGS = frozenset(
    {
        *("address", "article", "aside", "blockquote", "br", "dd", "div", "dl", "dt"),
        *("figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6"),
        *("header", "hr", "li", "main", "nav", "ol", "p", "pre", "section", "table"),
        *("td", "th", "title", "tr", "ul"),
    }
)
_TEXTUAL_APPLICATION = (
    "json",
    "xml",
    "javascript",
    "ecmascript",
    "yaml",
    "toml",
    "x-sh",
    "x-httpd-php",
    "sql",
    "graphql",
    "x-www-form-urlencoded",
    "ld+json",
    "csv",
)
_BINARY_PREFIXES = ("image/", "audio/", "video/", "font/", "model/")
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.I)

# Hostnames seen resolving to refused addresses in this process; see the module docstring.
_private_names: set[str] = set()


class WebFetchParams(ToolParams):
    url: str = Field(description="The http:// or https:// URL to fetch.")
    format: Literal["markdown", "text", "html"] = Field(
        default="markdown",
        description=(
            "markdown (default): HTML converted to markdown; text: the page's text without "
            "tags; html: the raw HTML."
        ),
    )
    timeout: float = Field(
        default=DEFAULT_TIMEOUT,
        gt=0,
        description=f"Seconds to allow for the whole fetch (at most {MAX_TIMEOUT:g}).",
    )
    # Decided at validation, read by both permissions() and execute (see the docstring).
    _private_host: str | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        value = value.strip()
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError as e:
            raise ValueError(f"not a valid URL: {e}") from None
        if parts.scheme.lower() not in ("http", "https"):
            raise ValueError("the URL must start with http:// or https://")
        if not parts.hostname:
            raise ValueError("the URL has no host")
        return value

    def model_post_init(self, context: Any, /) -> None:
        host = url_host(self.url)
        if needs_private_permission(host):
            self._private_host = host


def normalize_host(host: str) -> str:
    """Lower case, no IPv6 brackets, no trailing dot: the form rules and checks compare."""
    return host.strip("[]").rstrip(".").lower()


def url_host(url: str) -> str:
    return normalize_host(urlsplit(url).hostname or "")


def refused_kind(address: str) -> str | None:
    """Why an address may not be fetched without permission, or None if it is public."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        # ::ffff:127.0.0.1 reaches 127.0.0.1; Python 3.11 does not judge it as loopback.
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private:
        return "private" if ip.version == 4 else "private (unique-local)"
    if not ip.is_global:
        # Shared (CGNAT), documentation and other special ranges are not the internet.
        return "non-public"
    return None


def needs_private_permission(host: str) -> bool:
    """Whether fetching ``host`` needs ``webfetch_private``, decided without DNS."""
    host = normalize_host(host)
    if host == "localhost" or host.endswith(".localhost"):
        return True
    return refused_kind(host) is not None or host in _private_names


class PrivateAddressRefused(Exception):
    def __init__(self, host: str, address: str, kind: str) -> None:
        super().__init__(f"{host} resolves to {address}, a {kind} address")
        self.host = host
        self.address = address
        self.kind = kind


async def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to, in the resolver's order."""
    infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    addresses: list[str] = []
    for *_, sockaddr in infos:
        address = str(sockaddr[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


def _client(allowed_private: str | None) -> httpx.AsyncClient:
    """An httpx client whose every connection goes through the address check."""
    import httpcore
    import httpx

    # httpcore exports no Trio backend; this one has been in place since httpcore 0.14.
    from httpcore._backends.trio import TrioBackend

    class GuardedBackend(httpcore.AsyncNetworkBackend):
        def __init__(self) -> None:
            self._inner = TrioBackend()

        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
            local_address: str | None = None,
            socket_options: Any = None,
        ) -> httpcore.AsyncNetworkStream:
            name = normalize_host(host)
            try:
                addresses = await resolve(name, port)
            except OSError as e:
                raise httpcore.ConnectError(f"cannot resolve {name}: {e}") from None
            if name != allowed_private:
                for address in addresses:
                    kind = refused_kind(address)
                    if kind is not None:
                        raise PrivateAddressRefused(name, address, kind)
            error: Exception | None = None
            # Connect to the very address judged above, never to a fresh DNS answer.
            for address in addresses:
                try:
                    return await self._inner.connect_tcp(
                        address,
                        port,
                        timeout=timeout,
                        local_address=local_address,
                        socket_options=socket_options,
                    )
                except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                    error = e
            raise error or httpcore.ConnectError(f"{name} has no addresses")

        async def connect_unix_socket(
            self,
            path: str,
            timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
            socket_options: Any = None,
        ) -> httpcore.AsyncNetworkStream:
            raise httpcore.ConnectError("unix sockets are not used by webfetch")

        async def sleep(self, seconds: float) -> None:
            await trio.sleep(seconds)

    class GuardedTransport(httpx.AsyncHTTPTransport):
        # httpx has no public hook for the network backend. Its transport's only state is
        # the pool it forwards requests to (and maps httpcore errors from), so the pool is
        # built here, like httpx builds it, but with the guarded backend.
        def __init__(self) -> None:
            self._pool = httpcore.AsyncConnectionPool(
                ssl_context=httpx.create_ssl_context(trust_env=False),
                network_backend=GuardedBackend(),
            )

    return httpx.AsyncClient(
        transport=GuardedTransport(), trust_env=False, follow_redirects=False, timeout=None
    )


# --- content ------------------------------------------------------------------------------


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _is_html(media: str) -> bool:
    return media in ("text/html", "application/xhtml+xml")


def _is_textual(media: str) -> bool | None:
    """True for text, False for binary, None when only the bytes can tell."""
    if not media or media in ("application/octet-stream", "binary/octet-stream"):
        return None
    if media.startswith("text/") or media.endswith(("+json", "+xml")):
        return True
    if media.startswith("application/"):
        sub = media.removeprefix("application/")
        return True if any(part in sub for part in _TEXTUAL_APPLICATION) else None
    if media.startswith(_BINARY_PREFIXES) or media.startswith("multipart/"):
        return False
    return None


def _charset(content_type: str, body: bytes, html: bool) -> str:
    match = re.search(r"charset\s*=\s*[\"']?([A-Za-z0-9_.:-]+)", content_type, re.I)
    if match is None and html:
        match_bytes = _META_CHARSET.search(body[:4096])
        name = match_bytes.group(1).decode("ascii") if match_bytes else None
    else:
        name = match.group(1) if match else None
    if name:
        with contextlib.suppress(LookupError):
            return codecs.lookup(name).name
    return "utf-8"


def _soup(html: str, base_url: str) -> BeautifulSoup:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(_DROP_TAGS):
        tag.decompose()
    for img in soup.find_all("img"):
        src = str(img.get("src", ""))
        if src.startswith("data:"):
            # An inline image is kilobytes of base64 that tell the model nothing.
            img.decompose()
        elif src:
            img["src"] = urljoin(base_url, src)
    for link in soup.find_all("a", href=True):
        # A relative link is useless once the page is out of its context.
        link["href"] = urljoin(base_url, str(link["href"]))
    return soup


def html_to_markdown(html: str, base_url: str = "") -> str:
    from markdownify import ATX, MarkdownConverter

    converter = MarkdownConverter(heading_style=ATX, bullets="-")
    markdown = converter.convert_soup(_soup(html, base_url))
    return re.sub(r"\n{3,}", "\n\n", markdown).strip() + "\n"


def html_to_text(html: str, base_url: str = "") -> str:
    from bs4.element import CData, NavigableString, Tag

    parts: list[str] = []
    # One walk, no tree edits: inserting separators into a big page is quadratic in bs4.
    for node in _soup(html, base_url).descendants:
        if isinstance(node, Tag):
            if node.name in _BLOCK_TAGS:
                # Inline elements (links, emphasis) stay inside their sentence; blocks and
                # line breaks start a new line.
                parts.append("\n")
        elif type(node) in (NavigableString, CData):
            parts.append(str(node))
    lines = (" ".join(line.split()) for line in "".join(parts).splitlines())
    return "\n".join(line for line in lines if line) + "\n"


# --- the tool -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Fetched:
    url: str
    redirects: int
    status: int
    content_type: str
    body: bytes
    truncated: bool


async def _read_capped(response: httpx.Response) -> tuple[bytes, bool]:
    """At most MAX_RESPONSE_BYTES of the decoded body, and whether more was there."""
    body = bytearray()
    # aiter_bytes is an async generator; closing it at once keeps its cleanup in this task.
    chunks = cast("AsyncGenerator[bytes, None]", response.aiter_bytes())
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            room = MAX_RESPONSE_BYTES - len(body)
            if len(chunk) > room:
                # Stop reading: the rest is never downloaded, the connection just closes.
                body += chunk[:room]
                return bytes(body), True
            body += chunk
    return bytes(body), False


async def _fetch(url: str, fmt: str, allowed_private: str | None) -> _Fetched:
    import httpx

    headers = {"User-Agent": USER_AGENT, "Accept": _ACCEPT[fmt], "Accept-Language": "en"}
    visited: list[str] = []
    async with _client(allowed_private) as client:
        current = httpx.URL(url)
        while True:
            visited.append(str(current))
            async with client.stream("GET", current, headers=headers) as response:
                location = response.headers.get("location")
                if response.status_code in _REDIRECTS and location:
                    target = current.join(location)
                    if target.scheme not in ("http", "https"):
                        raise ToolFailure(
                            f"{current} redirects to {target}, which is not an http or "
                            "https URL; it was not followed."
                        )
                    if str(target) in visited:
                        raise ToolFailure(
                            f"Redirect loop: {current} redirects back to {target}. Chain: "
                            + " -> ".join([*visited, str(target)])
                        )
                    if len(visited) > MAX_REDIRECTS:
                        raise ToolFailure(
                            f"Stopped after {MAX_REDIRECTS} redirects; {current} redirects "
                            f"on to {target}."
                        )
                    current = target
                    continue
                if not response.is_success:
                    status = response.status_code
                    reason = response.reason_phrase or httpx.codes.get_reason_phrase(status)
                    raise ToolFailure(f"Request failed: HTTP {status} {reason} for {current}.")
                content_type = response.headers.get("content-type", "")
                textual = _is_textual(_media_type(content_type))
                if textual is False:
                    raise ToolFailure(
                        f"{current} is binary content ({_media_type(content_type)}); "
                        "webfetch returns only text, HTML and other textual content."
                    )
                body, cut = await _read_capped(response)
                if textual is None and looks_binary(body[:4096]):
                    shown = _media_type(content_type) or "no content type"
                    raise ToolFailure(
                        f"{current} is binary content ({shown}); webfetch returns only text, "
                        "HTML and other textual content."
                    )
                return _Fetched(
                    str(current), len(visited) - 1, response.status_code, content_type, body, cut
                )


def _refusal(error: PrivateAddressRefused, url: str, host: str) -> ToolFailure:
    redirected = error.host != host
    if redirected:
        opening = f"Refused a redirect from {url}: {error}"
    else:
        opening = f"Refused to fetch {url}: {error}"
    if needs_private_permission(error.host) and redirected:
        # An IP literal or localhost: fetching it directly asks for the permission.
        hint = (
            f"Fetching a URL on {error.host} directly asks for permission "
            f"webfetch_private:{error.host}."
        )
    else:
        hint = (
            f"If the user wants the agent to reach {error.host}, they can allow it with "
            f"`--allow webfetch_private:{error.host}`; calling webfetch again for a URL on "
            f"{error.host} asks for that permission."
        )
    return ToolFailure(
        f"{opening}. Requests to loopback, link-local and private networks are blocked "
        f"unless the user allows the host explicitly. {hint}"
    )


class WebFetchTool(Tool[WebFetchParams]):
    name = "webfetch"
    description = (
        "Fetch a web page or other text resource by URL.\n"
        "- The url must be a full http:// or https:// URL.\n"
        "- format: markdown (default) converts HTML to markdown; text strips the tags; html "
        "returns the page's HTML. Other textual types (JSON, plain text) come back as they "
        "are; binary content (images, PDFs, archives) is refused.\n"
        f"- Responses are cut at {MAX_RESPONSE_BYTES // (1024 * 1024)} MB; timeout is in "
        f"seconds (default {DEFAULT_TIMEOUT:g}, at most {MAX_TIMEOUT:g}); up to "
        f"{MAX_REDIRECTS} redirects are followed.\n"
        "- Addresses on loopback, link-local or private networks are refused unless the user "
        "has allowed that host.\n"
        "- Long pages are truncated in the result, with the full text saved to a file you can "
        "read or grep."
    )
    params = WebFetchParams
    read_only = True

    def permissions(self, args: WebFetchParams, ctx: ToolContext) -> list[PermissionNeed]:
        parts = urlsplit(args.url)
        host = url_host(args.url)
        shown_host = f"[{host}]" if ":" in host else host
        origin = shown_host if parts.port is None else f"{shown_host}:{parts.port}"
        needs = [
            PermissionNeed(
                permission="webfetch",
                pattern=args.url,
                always=f"{parts.scheme.lower()}://{origin}/*",
                metadata={"url": args.url, "format": args.format},
            )
        ]
        if args._private_host is not None:
            needs.append(
                PermissionNeed(
                    permission="webfetch_private",
                    pattern=args._private_host,
                    always=args._private_host,
                    metadata={"url": args.url, "host": args._private_host},
                )
            )
        return needs

    def title(self, args: WebFetchParams) -> str:
        return f"webfetch {args.url}"

    async def execute(self, args: WebFetchParams, ctx: ToolContext) -> ToolOutput:
        import httpx

        timeout = min(args.timeout, MAX_TIMEOUT)
        host = url_host(args.url)
        fetched: _Fetched | None = None
        text = ""
        with trio.move_on_after(timeout) as scope:
            try:
                fetched = await _fetch(args.url, args.format, args._private_host)
            except PrivateAddressRefused as error:
                if refused_kind(error.host) is None:
                    # A name, not a literal: from now on its fetches ask for the permission.
                    _private_names.add(error.host)
                raise _refusal(error, args.url, host) from None
            except (httpx.HTTPError, httpx.InvalidURL) as error:
                detail = str(error) or type(error).__name__
                raise ToolFailure(f"Cannot fetch {args.url}: {detail}") from None
            text = await trio.to_thread.run_sync(
                _render, fetched, args.format, abandon_on_cancel=True
            )
        if scope.cancelled_caught or fetched is None:
            raise ToolFailure(f"Timed out after {timeout:g} s fetching {args.url}.")

        if fetched.truncated:
            text += (
                f"\n\n(Response cut at the {MAX_RESPONSE_BYTES // (1024 * 1024)} MB cap; "
                "the rest was not read.)"
            )
        metadata: dict[str, Any] = {
            "status": fetched.status,
            "content_type": fetched.content_type,
            "bytes": len(fetched.body),
            "truncated": fetched.truncated,
        }
        if fetched.redirects:
            metadata["final_url"] = fetched.url
            metadata["redirects"] = fetched.redirects
        return ToolOutput(text, title=f"webfetch {args.url}", metadata=metadata)


def _render(fetched: _Fetched, fmt: str) -> str:
    media = _media_type(fetched.content_type)
    html = _is_html(media) or (
        not media and fetched.body.lstrip()[:15].lower() in (b"<!doctype html>",)
    )
    text = fetched.body.decode(_charset(fetched.content_type, fetched.body, html), "replace")
    if html and fmt == "markdown":
        return html_to_markdown(text, fetched.url)
    if html and fmt == "text":
        return html_to_text(text, fetched.url)
    return text
