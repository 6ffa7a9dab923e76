"""harness.lean_imports: the CLI's libraries load without their extras for other programs,
and still work in full (each case in a fresh interpreter: imports happen once)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_LEAN = """
import sys
from harness import install_lean_imports
install_lean_imports()
import structlog, httpx, pydantic
lean = ("rich", "pygments", "click", "asyncio", "importlib.metadata")
absent = [m for m in lean if m in sys.modules]
assert absent == [], absent

class Model(pydantic.BaseModel):  # pydantic builds a model without looking for plugins
    x: int
assert Model(x=1).x == 1
assert "importlib.metadata" not in sys.modules
assert any(type(f).__name__ == "_LeanFinder" for f in sys.meta_path)  # the SDK's utils to come

# structlog raises pickle's own PicklingError, without pickle loaded for it.
import structlog._output
assert "pickle" not in sys.modules
import pickle
assert structlog._output.PicklingError is pickle.PicklingError

# structlog's async helpers reach the real asyncio on first use.
import structlog.stdlib
import asyncio
assert structlog.stdlib.asyncio.get_running_loop is asyncio.get_running_loop
async def main():
    return await structlog.stdlib.get_logger().ainfo("async log")
asyncio.run(main())

# hashlib and hmac load without OpenSSL and give the same digests (standard test vectors);
# ssl still loads OpenSSL for TLS.
import hashlib, hmac, secrets
assert "_hashlib" not in sys.modules
sha = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
assert hashlib.sha256(b"abc").hexdigest() == sha
assert hashlib.new("sha256", b"abc").hexdigest() == sha
fox = b"The quick brown fox jumps over the lazy dog"
mac = "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
assert hmac.new(b"key", fox, "sha256").hexdigest() == mac
assert hmac.digest(b"key", fox, "sha256").hex() == mac
assert secrets.compare_digest(mac, mac) and not secrets.compare_digest(mac, sha)
import ssl
assert ssl.create_default_context().verify_mode == ssl.CERT_REQUIRED

# The hidden extras import as usual afterwards, and loggers still render exceptions.
import rich.console
renderer = structlog.dev.ConsoleRenderer(colors=False)
try:
    raise ValueError("boom")
except ValueError:
    line = renderer(None, "error", {"event": "failed", "exc_info": sys.exc_info()})
assert "ValueError: boom" in line and "Traceback" in line, line
print("ok")
"""

_SDK = """
import sys
from harness import install_lean_imports
install_lean_imports()
import harness.providers.mistral as ours
import structlog, trio, httpcore, http.client, urllib.request  # what else the finder awaits
assert "asyncio" not in sys.modules
utils = sys.modules["mistralai.client.utils"]
import asyncio
assert utils.asyncio.to_thread is asyncio.to_thread
# httpcore's certifi (for TLS) and anyio (for asyncio) come on first use.
assert "certifi" not in sys.modules and "anyio" not in sys.modules
import httpcore._ssl, httpcore._synchronization
assert httpcore._ssl.default_ssl_context().verify_mode == 2  # ssl.CERT_REQUIRED
async def lock_under_asyncio():
    async with httpcore._synchronization.AsyncLock():
        return "locked"
assert asyncio.run(lock_under_asyncio()) == "locked"
assert "certifi" in sys.modules and "anyio" in sys.modules
from mistralai.client import Mistral  # the whole SDK still loads and builds a client
assert Mistral(api_key="x").chat is not None
assert not any(type(f).__name__ == "_LeanFinder" for f in sys.meta_path)  # all done: it left
print("ok")
"""

_ALREADY_LOADED = """
import sys
import rich, asyncio  # a program that loaded them first keeps them as they are
from harness import install_lean_imports
install_lean_imports()
import structlog.dev, structlog.stdlib
assert structlog.dev.rich is rich
assert structlog.stdlib.asyncio is asyncio
print("ok")
"""


# Trio's worker threads get their OS names as without harness, with no ctypes loaded.
_THREAD_NAMES = """
import json, sys, threading
if sys.argv[1] == "lean":
    from harness import install_lean_imports
    install_lean_imports()
import trio

def comm(tid):
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().strip()

def job():
    return threading.get_native_id(), comm(threading.get_native_id())

async def main():
    named = await trio.to_thread.run_sync(job, thread_name="a job with a long name")
    default = await trio.to_thread.run_sync(job)
    await trio.sleep(0.05)  # the worker has reset its name after the job
    return [named[1], default[1], comm(named[0])]

names = trio.run(main)
loaded = "ctypes" in sys.modules
import ctypes  # and ctypes itself still loads and works
print(json.dumps({"names": names, "ctypes_loaded": loaded, "abs": ctypes.c_int(-3).value}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc thread names")
def test_trio_names_its_threads_as_before_without_ctypes() -> None:
    def run(mode: str) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-c", _THREAD_NAMES, mode], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
        return result

    plain, lean = run("plain"), run("lean")
    assert lean["names"] == plain["names"]
    names = plain["names"]
    assert isinstance(names, list) and names[0] == "a job with a lo"  # 15 bytes, as the OS keeps
    assert names[2].startswith("Trio thread")  # back to its own name after the job
    assert plain["ctypes_loaded"] is True and lean["ctypes_loaded"] is False
    assert lean["abs"] == -3


@pytest.mark.parametrize(
    "probe", [_LEAN, _SDK, _ALREADY_LOADED], ids=["lean", "sdk", "already-loaded"]
)
def test_libraries_load_lean_and_still_work(probe: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "ok"
