"""The webfetch tool against a real HTTP server on 127.0.0.1 (trio.serve_tcp + h11)."""

from __future__ import annotations

import functools
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import h11
import pytest
import trio
from pydantic import ValidationError

from harness.tools import webfetch
from harness.tools.base import ToolContext, ToolFailure, ToolOutput
from harness.tools.webfetch import (
    MAX_RESPONSE_BYTES,
    WebFetchParams,
    WebFetchTool,
    needs_private_permission,
    refused_kind,
)

if TYPE_CHECKING:
    from conftest import ToolContextFactory

PAGE = b"""<!doctype html>
<html><head><title>Demo page</title><style>body { color: red }</style></head>
<body>
<h1>Release notes</h1>
<p>Read <a href="https://example.com/docs">the docs</a> first.</p>
<p><a href="/changelog">Changes</a> <img src="logo.png" alt="Logo">
<img src="data:image/png;base64,iVBORw0KGgoAAAANSUhEUg" alt="inline"></p>
<script>var secret = "do-not-show";</script>
<ul><li>one</li><li>two</li></ul>
</body></html>
"""


@dataclass
class Page:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    delay: float = 0.0


@dataclass
class Server:
    port: int = 0
    pages: dict[str, Page] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def redirect(self, path: str, location: str, status: int = 302) -> None:
        self.pages[path] = Page(status, [("location", location)])

    async def handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    break
            headers = dict(event.headers)
            self.hosts.append(headers[b"host"].decode())
            page = self.pages.get(event.target.decode(), Page(404, body=b"not found"))
            await trio.sleep(page.delay)
            response_headers = [
                ("content-length", str(len(page.body))),
                ("connection", "close"),
                *page.headers,
            ]
            await stream.send_all(
                conn.send(h11.Response(status_code=page.status, headers=response_headers))
            )
            for start in range(0, len(page.body), 65536):
                chunk = page.body[start : start + 65536]
                await stream.send_all(conn.send(h11.Data(data=chunk)))
            await stream.send_all(conn.send(h11.EndOfMessage()))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client stopped reading (size cap, timeout): expected
        finally:
            await stream.aclose()


@pytest.fixture
async def server(nursery: trio.Nursery) -> Server:
    srv = Server()
    listeners = await nursery.start(
        functools.partial(trio.serve_tcp, srv.handle, 0, host="127.0.0.1")
    )
    srv.port = listeners[0].socket.getsockname()[1]
    html = [("content-type", "text/html; charset=utf-8")]
    srv.pages["/page"] = Page(headers=html, body=PAGE)
    return srv


@pytest.fixture
def ctx(tmp_path: Path, tool_context: ToolContextFactory) -> ToolContext:
    return tool_context(tmp_path.resolve())


@pytest.fixture(autouse=True)
def fresh_private_names(monkeypatch: pytest.MonkeyPatch) -> None:
    # Names learned by one test must not make another test's permissions differ.
    monkeypatch.setattr(webfetch, "_private_names", set())


tool = WebFetchTool()


def params(url: str, **extra: object) -> WebFetchParams:
    return WebFetchParams.model_validate({"url": url, **extra})


async def fetch(url: str, ctx: ToolContext, **extra: object) -> ToolOutput:
    return await tool.execute(params(url, **extra), ctx)


# --- content -------------------------------------------------------------------------------


async def test_html_page_becomes_markdown(server: Server, ctx: ToolContext) -> None:
    out = await fetch(server.url("/page"), ctx)
    assert "# Release notes" in out.output
    assert "[the docs](https://example.com/docs)" in out.output
    assert "- one" in out.output
    # Relative links and images point back at the server; inline data images are dropped.
    assert f"[Changes]({server.url('/changelog')})" in out.output
    assert f"![Logo]({server.url('/logo.png')})" in out.output
    assert "base64" not in out.output
    assert "do-not-show" not in out.output
    assert "color: red" not in out.output
    assert out.title == f"webfetch {server.url('/page')}"
    assert out.metadata == {
        "status": 200,
        "content_type": "text/html; charset=utf-8",
        "bytes": len(PAGE),
        "truncated": False,
    }


async def test_text_format_strips_tags(server: Server, ctx: ToolContext) -> None:
    out = await fetch(server.url("/page"), ctx, format="text")
    assert "Release notes" in out.output
    assert "Release notes\nRead the docs first.\nChanges\none\ntwo\n" in out.output
    assert "<" not in out.output
    assert "](" not in out.output
    assert "do-not-show" not in out.output


async def test_html_format_returns_the_page(server: Server, ctx: ToolContext) -> None:
    out = await fetch(server.url("/page"), ctx, format="html")
    assert out.output == PAGE.decode()


async def test_other_textual_content_is_returned_as_is(server: Server, ctx: ToolContext) -> None:
    body = b'{"name": "caf\xc3\xa9"}'
    server.pages["/data.json"] = Page(headers=[("content-type", "application/json")], body=body)
    out = await fetch(server.url("/data.json"), ctx)
    assert out.output == '{"name": "café"}'


async def test_charset_from_header_is_used(server: Server, ctx: ToolContext) -> None:
    body = "Größe".encode("latin-1")
    header = [("content-type", "text/plain; charset=iso-8859-1")]
    server.pages["/latin"] = Page(headers=header, body=body)
    out = await fetch(server.url("/latin"), ctx)
    assert out.output == "Größe"


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("image/png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64),
        ("application/octet-stream", b"\x00\x01\x02binary\x00" * 20),
        ("", b"\x00\x01\x02\x03" * 20),
    ],
)
async def test_binary_content_is_refused(
    server: Server, ctx: ToolContext, content_type: str, body: bytes
) -> None:
    headers = [("content-type", content_type)] if content_type else []
    server.pages["/blob"] = Page(headers=headers, body=body)
    with pytest.raises(ToolFailure, match="binary content"):
        await fetch(server.url("/blob"), ctx)


async def test_body_is_cut_at_the_cap(server: Server, ctx: ToolContext) -> None:
    body = b"0123456789abcdef\n" * (6 * 1024 * 1024 // 17)
    assert len(body) > 6_000_000
    server.pages["/big"] = Page(headers=[("content-type", "text/plain")], body=body)
    out = await fetch(server.url("/big"), ctx)
    assert out.metadata["truncated"] is True
    assert out.metadata["bytes"] == MAX_RESPONSE_BYTES
    assert out.output.startswith("0123456789abcdef\n")
    assert out.output.endswith("(Response cut at the 5 MB cap; the rest was not read.)")


async def test_body_exactly_at_the_cap_is_not_truncated(server: Server, ctx: ToolContext) -> None:
    body = b"x" * MAX_RESPONSE_BYTES
    server.pages["/exact"] = Page(headers=[("content-type", "text/plain")], body=body)
    out = await fetch(server.url("/exact"), ctx)
    assert out.metadata["truncated"] is False
    assert out.metadata["bytes"] == MAX_RESPONSE_BYTES


async def test_slow_server_times_out(server: Server, ctx: ToolContext) -> None:
    server.pages["/slow"] = Page(body=b"late", delay=30)
    start = trio.current_time()
    with pytest.raises(ToolFailure, match=r"Timed out after 0\.3 s"):
        await fetch(server.url("/slow"), ctx, timeout=0.3)
    assert trio.current_time() - start < 5


async def test_http_error_status_is_a_failure(server: Server, ctx: ToolContext) -> None:
    with pytest.raises(ToolFailure, match="HTTP 404 Not Found"):
        await fetch(server.url("/missing"), ctx)


async def test_timeout_is_capped_not_rejected() -> None:
    assert params("https://example.com", timeout=600).timeout == 600
    with pytest.raises(ValidationError):
        params("https://example.com", timeout=0)


# --- redirects -----------------------------------------------------------------------------


def hop_chain(server: Server, length: int) -> str:
    """``/hopN`` redirects N times before reaching the page."""
    for n in range(1, length + 1):
        server.redirect(f"/hop{n}", f"/hop{n - 1}" if n > 1 else server.url("/page"))
    return server.url(f"/hop{length}")


async def test_redirects_are_followed(server: Server, ctx: ToolContext) -> None:
    out = await fetch(hop_chain(server, 5), ctx)
    assert "# Release notes" in out.output
    assert out.metadata["final_url"] == server.url("/page")
    assert out.metadata["redirects"] == 5


async def test_too_many_redirects_are_stopped(server: Server, ctx: ToolContext) -> None:
    with pytest.raises(ToolFailure, match="Stopped after 5 redirects"):
        await fetch(hop_chain(server, 6), ctx)


async def test_redirect_loop_is_stopped(server: Server, ctx: ToolContext) -> None:
    server.redirect("/a", "/b", status=301)
    server.redirect("/b", "/a", status=307)
    with pytest.raises(ToolFailure, match="Redirect loop") as caught:
        await fetch(server.url("/a"), ctx)
    assert f"{server.url('/a')} -> {server.url('/b')} -> {server.url('/a')}" in str(caught.value)
    assert len(server.hosts) == 2


async def test_redirect_to_another_private_host_is_refused(
    server: Server, ctx: ToolContext
) -> None:
    # 127.0.0.1 was allowed for this call; localhost is a different host and was not.
    server.redirect("/out", server.url("/page", host="localhost"))
    with pytest.raises(ToolFailure, match="Refused a redirect") as caught:
        await fetch(server.url("/out"), ctx)
    assert "webfetch_private:localhost" in str(caught.value)
    assert len(server.hosts) == 1


async def test_redirect_to_another_scheme_is_refused(server: Server, ctx: ToolContext) -> None:
    server.redirect("/ftp", "ftp://example.com/file")
    with pytest.raises(ToolFailure, match="not an http or https URL"):
        await fetch(server.url("/ftp"), ctx)


# --- permissions and the private-address guard ---------------------------------------------


def test_public_url_needs_only_webfetch(ctx: ToolContext) -> None:
    needs = tool.permissions(params("https://Example.com/a/b?q=1"), ctx)
    assert [(n.permission, n.pattern, n.always) for n in needs] == [
        ("webfetch", "https://Example.com/a/b?q=1", "https://example.com/*")
    ]


async def test_loopback_literal_adds_the_private_need(server: Server, ctx: ToolContext) -> None:
    url = server.url("/page")
    needs = tool.permissions(params(url), ctx)
    assert [(n.permission, n.pattern, n.always) for n in needs] == [
        ("webfetch", url, f"http://127.0.0.1:{server.port}/*"),
        ("webfetch_private", "127.0.0.1", "127.0.0.1"),
    ]


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://localhost:8080/", "localhost"),
        ("http://LOCALHOST./", "localhost"),
        ("http://api.localhost/", "api.localhost"),
        ("http://[::1]:9000/x", "::1"),
        ("http://10.1.2.3/", "10.1.2.3"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
        ("https://[fd12::1]/", "fd12::1"),
        ("http://0.0.0.0:8000/", "0.0.0.0"),
    ],
)
def test_private_hosts_need_webfetch_private(url: str, host: str, ctx: ToolContext) -> None:
    needs = tool.permissions(params(url), ctx)
    assert needs[-1].permission == "webfetch_private"
    assert (needs[-1].pattern, needs[-1].always) == (host, host)


def test_ipv6_origin_keeps_its_brackets(ctx: ToolContext) -> None:
    needs = tool.permissions(params("http://[::1]:9000/x"), ctx)
    assert needs[0].always == "http://[::1]:9000/*"


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://example.com/x", "javascript:alert(1)", "http://", "x"]
)
def test_non_http_urls_fail_validation(url: str) -> None:
    with pytest.raises(ValidationError):
        params(url)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("10.0.0.1", "private"),
        ("192.168.1.1", "private"),
        ("172.16.0.1", "private"),
        ("fd00::1", "private (unique-local)"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "non-public"),
        ("93.184.216.34", None),
        ("2606:4700:4700::1111", None),
        ("example.com", None),
    ],
)
def test_refused_kind(address: str, kind: str | None) -> None:
    assert refused_kind(address) == kind


def test_dns_names_need_no_private_permission_up_front() -> None:
    assert not needs_private_permission("example.com")
    assert not needs_private_permission("intranet.test")


async def test_name_resolving_privately_is_refused_then_asked(
    server: Server, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_resolve = webfetch.resolve

    async def fake_resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.1"] if host == "intranet.test" else await real_resolve(host, port)

    monkeypatch.setattr(webfetch, "resolve", fake_resolve)
    url = server.url("/page", host="intranet.test")

    first = params(url)
    assert [n.permission for n in tool.permissions(first, ctx)] == ["webfetch"]
    with pytest.raises(ToolFailure) as caught:
        await tool.execute(first, ctx)
    message = str(caught.value)
    assert "intranet.test resolves to 127.0.0.1, a loopback address" in message
    assert "--allow webfetch_private:intranet.test" in message
    assert server.hosts == []  # refused before any connection

    # The next call asks for the permission; granted, the fetch goes through.
    second = params(url)
    needs = tool.permissions(second, ctx)
    assert [(n.permission, n.pattern) for n in needs] == [
        ("webfetch", url),
        ("webfetch_private", "intranet.test"),
    ]
    out = await tool.execute(second, ctx)
    assert "# Release notes" in out.output
    # Connected to the checked address, but the request still names the host.
    assert server.hosts == [f"intranet.test:{server.port}"]


async def test_localhost_resolves_for_real_once_allowed(server: Server, ctx: ToolContext) -> None:
    out = await fetch(server.url("/page", host="localhost"), ctx)
    assert "# Release notes" in out.output


async def test_unresolvable_host_is_a_failure(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_such_host(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    # The resolver is faked so the test does not depend on the machine's DNS.
    monkeypatch.setattr(webfetch, "resolve", no_such_host)
    with pytest.raises(ToolFailure, match=r"Cannot fetch .*cannot resolve no-such-host\.invalid"):
        await fetch("http://no-such-host.invalid/", ctx)


def test_module_import_is_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, harness.tools.webfetch; "
        "print(any(m in sys.modules for m in ('httpx', 'bs4', 'markdownify')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_every_caller_sees_one_description() -> None:
    schema: dict[str, object] = WebFetchParams.model_json_schema()
    assert set(schema["properties"]) == {"url", "format", "timeout"}  # type: ignore[arg-type]
