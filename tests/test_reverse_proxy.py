"""The nginx block of docs/operations.md (docs/nginx/owllayer.conf), run as it is written
in front of a real daphne process: a page's WebSocket handshake passes, the
client's address reaches daphne from nginx's header only, and clients that
drip their request are closed by nginx within its timeouts.

Debian's nginx (`make nginx`) runs in the foreground as a child of the test,
on 127.0.0.1 only, with its configuration, logs and temporary files in the
test's directory. The file is changed only where a machine differs (ports,
the upstream address, certificate paths); each such line must be found
exactly once, so the test follows the file.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import websockets

from aitp_client import AitpClient, envelope
from tests.support.certificates import CertificateAuthority
from tests.support.daphne import (
    PROJECT_ROOT,
    SERVE_COMMAND,
    DaphneServer,
    _wait_until_listening,
    free_port,
    server_env,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

NGINX_BLOCK = PROJECT_ROOT / "docs" / "nginx" / "owllayer.conf"
SERVER_NAME = "owllayer.example.com"
ORIGIN = "https://shop.example"
SPOOFED_ADDRESS = "203.0.113.9"
STARTUP_TIMEOUT = 30.0
# Added to nginx's own timeout before a slow client counts as held open: two
# loaded cores shared by several test runs.
TIMEOUT_MARGIN = 5.0


def nginx_binary() -> str:
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("nginx is missing in CI (`make nginx` installs Debian's nginx)")
        pytest.skip("needs Debian's nginx (`make nginx` installs it as root)")
    return path


def block_seconds(directive: str) -> float:
    """A timeout the block sets, in seconds (``10s``, ``1m``, ``1h``)."""
    match = re.search(rf"^\s*{directive}\s+(\d+)([smh]?);", NGINX_BLOCK.read_text(), re.MULTILINE)
    assert match, f"{directive} is not set in {NGINX_BLOCK}"
    return int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def adapted_block(*, upstream_port: int, http_port: int, https_port: int,
                  cert: Path, key: Path) -> str:
    """The block with this machine's ports, upstream and certificate."""
    text = NGINX_BLOCK.read_text()
    changes = [
        ("server 127.0.0.1:8001 ", f"server 127.0.0.1:{upstream_port} "),
        ("server 127.0.0.1:8002 ", f"server 127.0.0.1:{upstream_port} "),
        ("listen 80;", f"listen 127.0.0.1:{http_port};"),
        ("listen [::]:80;", ""),
        ("listen 443 ssl;", f"listen 127.0.0.1:{https_port} ssl;"),
        ("listen [::]:443 ssl;", ""),
        ("ssl_certificate /etc/ssl/owllayer/fullchain.pem;", f"ssl_certificate {cert};"),
        ("ssl_certificate_key /etc/ssl/owllayer/privkey.pem;", f"ssl_certificate_key {key};"),
    ]
    for old, new in changes:
        assert text.count(old) == 1, f"{old!r} is not in {NGINX_BLOCK} exactly once"
        text = text.replace(old, new)
    return text


def main_conf(directory: Path) -> str:
    """What Debian's /etc/nginx/nginx.conf gives the block, kept in ``directory``."""
    user = "root" if os.geteuid() == 0 else ""
    return f"""{'user root;' if user else ''}
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log info;
events {{
    worker_connections 256;
}}
http {{
    access_log {directory}/access.log;
    client_body_temp_path {directory}/client_body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    include {directory}/owllayer.conf;
}}
"""


def wait_for_port(port: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"nginx exited with {process.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nginx not listening after {STARTUP_TIMEOUT}s:\n{log.read_text()}")


@pytest.fixture
def proxied(tmp_path, live_db_url):
    """daphne (--proxy-headers) behind nginx running the documented block;
    yields the https and http ports, the client TLS context and daphne."""
    binary = nginx_binary()
    ca = CertificateAuthority.create("Proxy Test CA")
    cert, key = ca.issue(tmp_path, SERVER_NAME)
    client_tls = ssl.create_default_context(cafile=str(ca.write(tmp_path)))

    daphne_port = free_port()
    env = {**server_env(live_db_url), "OWLLAYER_HTTPS": "true",
           "OWLLAYER_TRUST_X_FORWARDED_PROTO": "true", "ALLOWED_HOSTS": "127.0.0.1"}
    log_path = tmp_path / "daphne.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*SERVE_COMMAND, "--bind", "127.0.0.1", "--port", str(daphne_port), "--proxy-headers"],
            cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT,
        )
    daphne = DaphneServer(process, daphne_port, log_path)
    nginx = None
    try:
        _wait_until_listening(daphne, STARTUP_TIMEOUT)
        http_port, https_port = free_port(), free_port()
        (tmp_path / "owllayer.conf").write_text(adapted_block(
            upstream_port=daphne_port, http_port=http_port, https_port=https_port,
            cert=cert, key=key))
        (tmp_path / "nginx.conf").write_text(main_conf(tmp_path))
        nginx_log = tmp_path / "nginx-output.log"
        with open(nginx_log, "wb") as out:
            nginx = subprocess.Popen(
                [binary, "-p", str(tmp_path), "-e", str(tmp_path / "error.log"),
                 "-c", str(tmp_path / "nginx.conf"), "-g", "daemon off;"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )
        wait_for_port(https_port, nginx, tmp_path / "error.log")
        yield {"https": https_port, "http": http_port, "tls": client_tls, "daphne": daphne}
    finally:
        if nginx is not None and nginx.poll() is None:
            nginx.send_signal(signal.SIGQUIT)  # nginx's graceful stop
            try:
                nginx.wait(10)
            except subprocess.TimeoutExpired:
                nginx.kill()
                nginx.wait(10)
        daphne.stop()


@pytest.fixture
def raw_key(db):
    from aitp import tenancy

    tenant = tenancy.tenant_create(slug="proxied", name="Proxied Shop")
    _, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[ORIGIN])
    return raw


async def test_a_page_shakes_hands_through_nginx_and_daphne_sees_nginxs_address_only(
    proxied, raw_key
):
    url = f"wss://127.0.0.1:{proxied['https']}/owllayer"
    async with websockets.connect(
        url, ssl=proxied["tls"], server_hostname=SERVER_NAME, origin=ORIGIN, proxy=None,
        additional_headers={"X-Forwarded-For": SPOOFED_ADDRESS},
    ) as ws:
        page = AitpClient(url, api_key=raw_key)
        await ws.send(json.dumps(envelope("HANDSHAKE_INIT", page.handshake_payload())))
        ack = json.loads(await asyncio.wait_for(ws.recv(), 30))
    async with httpx.AsyncClient(verify=proxied["tls"], trust_env=False) as http:
        health = await http.get(f"https://127.0.0.1:{proxied['https']}/healthz",
                                extensions={"sni_hostname": SERVER_NAME})
        plain = await http.get(f"http://127.0.0.1:{proxied['http']}/healthz")
        # A proxy's own health check, straight to the process over plain HTTP.
        check = await http.get(f"{proxied['daphne'].http_url}/healthz")
        # ... and its readiness check, likewise.
        ready = await http.get(f"{proxied['daphne'].http_url}/readyz")
    proxied["daphne"].stop()

    assert ack["type"] == "HANDSHAKE_ACK", ack
    # X-Forwarded-Proto reached Django: no redirect to https for a request that was https.
    assert health.status_code == 200
    assert plain.status_code == 301 and plain.headers["location"].startswith("https://")
    assert check.status_code == 200
    assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
    logs = proxied["daphne"].logs()
    # --proxy-headers: the address comes from nginx's X-Forwarded-For (no
    # port there, so 0), which replaced the one the client wrote.
    assert re.search(r"^127\.0\.0\.1:0 - - \[.*\] \"WSCONNECT /owllayer\"", logs, re.MULTILINE), logs
    assert SPOOFED_ADDRESS not in logs


async def _held_open_for(port: int, tls: ssl.SSLContext | None, first_bytes: bytes,
                         limit: float) -> float:
    """Open a connection, send ``first_bytes`` and nothing more; the seconds
    until the other side closes it (``limit`` when it is still open then)."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=tls, server_hostname=SERVER_NAME if tls else None)
    try:
        if first_bytes:
            writer.write(first_bytes)
            await writer.drain()
        try:
            async with asyncio.timeout(limit):
                while await reader.read(4096):
                    pass  # nginx may answer 408 before it closes
        except TimeoutError:
            return limit
        except (ConnectionResetError, ssl.SSLError):
            pass
        return time.monotonic() - started
    finally:
        writer.close()


async def test_clients_that_drip_their_request_are_closed_by_nginx_within_its_timeouts(proxied):
    header_timeout = block_seconds("client_header_timeout")
    body_timeout = block_seconds("client_body_timeout")
    port, tls = proxied["https"], proxied["tls"]

    half_headers, no_tls_handshake, half_body = await asyncio.gather(
        _held_open_for(port, tls, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                       header_timeout + TIMEOUT_MARGIN),
        _held_open_for(port, None, b"", header_timeout + TIMEOUT_MARGIN),
        _held_open_for(port, tls, b"POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  b"Content-Length: 100\r\n\r\n0123456789",
                       body_timeout + TIMEOUT_MARGIN),
    )

    assert half_headers < header_timeout + TIMEOUT_MARGIN
    assert no_tls_handshake < header_timeout + TIMEOUT_MARGIN
    assert half_body < body_timeout + TIMEOUT_MARGIN
