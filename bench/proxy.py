"""nginx in front of the product: the "what does two give me?" line.

One nginx (Debian's package, ``make nginx``), a foreground child of the run
(``nginx -p <dir> -c <conf> -g 'daemon off;'``), listening on 127.0.0.1 only,
with its configuration, logs and temporary files in the run's scratch
directory. One listening port per upstream group: ``one`` (the first product
process), ``two`` (both product processes, least connections) and ``echo``
(the baseline). WebSocket upgrades are passed through; GET /readyz of
every group must answer 200 through nginx before the line starts (the
product ready: its database, Redis and migrations).
"""
from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.servers import HOST, Server, free_port, raise_open_files_limit, wait_listening

NGINX = "nginx"
HEALTH_TIMEOUT = 30.0


class ProxyError(RuntimeError):
    pass


def nginx_binary() -> str | None:
    return shutil.which(NGINX) or next(
        (path for path in ("/usr/sbin/nginx",) if Path(path).exists()), None)


def render_conf(directory: Path, listen: Mapping[str, int],
                upstreams: Mapping[str, Sequence[int]]) -> str:
    """The whole nginx.conf: one server block per upstream group. Pure."""
    blocks = []
    for group, ports in upstreams.items():
        servers = "\n".join(f"        server {HOST}:{port} max_fails=3 fail_timeout=5s;"
                            for port in ports)
        blocks.append(f"""
    upstream {group} {{
        least_conn;
{servers}
    }}
    server {{
        listen {HOST}:{listen[group]};
        location / {{
            proxy_pass http://{group};
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
            proxy_buffering off;
        }}
    }}""")
    return f"""# Written by the benchmark for one run; nothing outside {directory} is used.
worker_processes 1;
worker_rlimit_nofile 20000;
pid {directory}/nginx.pid;
error_log {directory}/nginx-error.log warn;
events {{
    worker_connections 16000;
}}
http {{
    access_log off;
    client_body_temp_path {directory}/client_body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        '' close;
    }}
{''.join(blocks)}
}}
"""


def start_nginx(directory: Path, upstreams: Mapping[str, Sequence[int]], *,
                products: Sequence[str]) -> tuple[Server, dict[str, int]]:
    """Write the configuration and start nginx in the foreground; the server
    (its ``port`` is the first group's) and the port of every group."""
    binary = nginx_binary()
    if binary is None:
        raise ProxyError("nginx is not installed (as root: make nginx, or apt-get install nginx)")
    directory.mkdir(parents=True, exist_ok=True)
    listen = {group: free_port() for group in upstreams}
    conf = directory / "nginx.conf"
    conf.write_text(render_conf(directory, listen, upstreams))
    log_path = directory / "nginx-output.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [binary, "-p", str(directory), "-e", str(directory / "nginx-error.log"),
             "-c", str(conf), "-g", "daemon off;"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=raise_open_files_limit,
        )
    server = Server("nginx", process, next(iter(listen.values())), log_path)
    wait_listening(server)
    for group, port in listen.items():
        wait_ready(f"http://{HOST}:{port}/readyz", server, product=group in products)
    return server, listen


def wait_ready(url: str, server: Server, *, product: bool,
               timeout: float = HEALTH_TIMEOUT) -> None:
    """GET ``url`` through nginx until the product's /readyz answers 200.
    The baseline serves no HTTP at all: any answer that is not nginx's own
    502/503/504 shows nginx reached it."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not server.running:
            raise ProxyError(f"nginx exited:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
                last = str(answer.status)
        except urllib.error.HTTPError as exc:
            last = f"{exc.code}"
            if not product and exc.code not in (502, 503, 504):
                return
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise ProxyError(f"{url} did not answer 200 within {timeout}s (last: {last})")
