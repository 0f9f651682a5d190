"""A newcomer's first hour, as real processes: `make run` and its steps,
two local servers side by side, and what manage.py and the server say when
something is not set up.

Every server here runs on a fresh SQLite file of its own (a fresh clone's
database), on a free 127.0.0.1 port, and is stopped by its pid.
"""
from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import websockets

from aitp_client import AitpClient, AitpRefused
from tests.support.daphne import PROJECT_ROOT, free_port, start_daphne

pytestmark = pytest.mark.e2e

# Django's start-up plus a migration of an empty database on a loaded machine.
COMMAND_TIMEOUT = 180
EVENT_TIMEOUT = 30


@pytest.fixture
def fresh(tmp_path: Path) -> dict[str, str]:
    """The environment of a fresh clone: debug mode, an empty SQLite file,
    the in-memory channel layer, the offline agent."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "PORT")}
    env.update(
        DJANGO_DEBUG="true",
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        # The demo pages and the console read the key `make run` saved here.
        OWLLAYER_DEMO_KEY_FILE=str(tmp_path / ".demo-key"),
        OWLLAYER_LLM="offline",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(PROJECT_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=PROJECT_ROOT, env=env,
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
    )


def serve_check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "owllayer_site.serve", "--bind", "127.0.0.1", *args],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
    )


def make_run_steps(env: dict[str, str], tmp_path: Path, port: int) -> str:
    """What `make run` does before it serves (Makefile, target run); its output."""
    checked = serve_check(env, "--check-port", "--port", str(port))
    assert checked.returncode == 0, checked.stderr
    migrated = manage(env, "migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr
    demo = manage(env, "ensure_demo", "--port", str(port), "--key-file", str(tmp_path / ".demo-key"),
                  "--logins-file", str(tmp_path / ".demo-logins"))
    assert demo.returncode == 0, demo.stderr
    return demo.stdout


def the_sign_ins(output: str) -> dict[str, str]:
    """{"admin": password, "demo-owner": password} from ensure_demo's lines."""
    found = {}
    for line in output.splitlines():
        if ", password " in line and "user " in line:
            user = line.split("user ", 1)[1].split(",", 1)[0]
            found[user] = line.split(", password ", 1)[1].split()[0]
    return found


async def handshake(port: int, raw_key: str) -> AitpClient:
    page = AitpClient(f"ws://127.0.0.1:{port}/owllayer", api_key=raw_key,
                      origin=f"http://127.0.0.1:{port}")
    await page.connect()
    return page


async def signs_in(port: int, login_path: str, username: str, password: str) -> bool:
    """A form sign-in as a browser does it: the form, its CSRF token, the post."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=EVENT_TIMEOUT) as http:
        form = await http.get(login_path)
        answer = await http.post(
            login_path,
            data={"username": username, "password": password,
                  "csrfmiddlewaretoken": http.cookies["csrftoken"]},
            headers={"Referer": f"http://127.0.0.1:{port}{login_path}"},
        )
        assert form.status_code == 200
        return answer.status_code == 302 and "sessionid" in http.cookies


def test_make_run_ends_with_the_store_admin_and_console_and_their_sign_ins_that_work(
    fresh, tmp_path
):
    port = free_port()
    output = make_run_steps(fresh, tmp_path, port)
    server = start_daphne(fresh, tmp_path, port=port)
    try:
        passwords = the_sign_ins(output)
        tail = output.rstrip().splitlines()[-4:]
        assert [line.split(":", 1)[0] for line in tail] == ["store", "admin", "console", "passwords"]
        assert f"http://127.0.0.1:{port}/demo/" in tail[0]
        assert f"http://127.0.0.1:{port}/admin/" in tail[1]
        assert f"http://127.0.0.1:{port}/console/" in tail[2]
        assert asyncio.run(signs_in(port, "/admin/login/", "admin", passwords["admin"]))
        assert asyncio.run(signs_in(port, "/console/login/", "demo-owner", passwords["demo-owner"]))
    finally:
        server.stop()


def test_a_second_server_on_another_port_leaves_the_first_ones_page_working(fresh, tmp_path):
    first_port, second_port = free_port(), free_port()
    make_run_steps(fresh, tmp_path, first_port)
    first = start_daphne(fresh, tmp_path, port=first_port)
    try:
        make_run_steps(fresh, tmp_path, second_port)
        second = start_daphne(fresh, tmp_path, port=second_port)
        try:
            raw_key = (tmp_path / ".demo-key").read_text().strip()

            async def both_pages_open() -> list[str | None]:
                pages = [await handshake(first_port, raw_key), await handshake(second_port, raw_key)]
                sessions = [page.session_id for page in pages]
                for page in pages:
                    await page.close()
                return sessions

            assert all(asyncio.run(both_pages_open()))
        finally:
            second.stop()
    finally:
        first.stop()


async def revoke_in_console(port: int, username: str, password: str) -> str:
    """Sign in to the console as the demo's owner, open the demo key's revoke
    page and revoke it, as a person does; the revoke page's text."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=EVENT_TIMEOUT) as http:
        await http.get("/console/login/")
        signed_in = await http.post("/console/login/", data={
            "username": username, "password": password, "csrfmiddlewaretoken": http.cookies["csrftoken"]})
        assert signed_in.status_code == 302
        keys = await http.get("/console/t/demo/keys/")
        [revoke_path] = re.findall(r'href="(/console/t/demo/keys/\d+/revoke/)"', keys.text)
        page = await http.get(revoke_path)
        revoked = await http.post(revoke_path, data={"csrfmiddlewaretoken": http.cookies["csrftoken"]})
        assert revoked.status_code == 302
        return page.text


async def refusal(port: int, raw_key: str) -> str | None:
    """The refusal code of a page on `port` opening with `raw_key`; None if it opened."""
    try:
        page = await handshake(port, raw_key)
    except AitpRefused as refused:
        return refused.code
    await page.close()
    return None


def test_after_the_demo_key_is_revoked_and_its_file_deleted_a_run_on_a_second_port_serves_both_stores(
    fresh, tmp_path
):
    first_port, second_port = free_port(), free_port()
    passwords = the_sign_ins(make_run_steps(fresh, tmp_path, first_port))
    first = start_daphne(fresh, tmp_path, port=first_port)
    try:
        old_key = (tmp_path / ".demo-key").read_text().strip()
        revoke_page = asyncio.run(revoke_in_console(first_port, "demo-owner", passwords["demo-owner"]))
        assert "This is the demo store's key." in revoke_page
        assert asyncio.run(refusal(first_port, old_key)) == "api_key_revoked"
        # What the README says: delete .demo-key, make run (here on a second port).
        (tmp_path / ".demo-key").unlink()
        make_run_steps(fresh, tmp_path, second_port)
        second = start_daphne(fresh, tmp_path, port=second_port)
        try:
            new_key = (tmp_path / ".demo-key").read_text().strip()

            assert new_key != old_key
            assert asyncio.run(refusal(first_port, new_key)) is None
            assert asyncio.run(refusal(second_port, new_key)) is None
        finally:
            second.stop()
    finally:
        first.stop()


def test_make_run_on_a_port_in_use_stops_at_once_naming_the_port_and_migrates_nothing(
    fresh, tmp_path
):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            ["make", "--no-print-directory", "run"], cwd=PROJECT_ROOT,
            env={**fresh, "PORT": str(port)}, capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
        )
    # make's own "make: ***" line (make[1] when the suite itself runs under make)
    ours = [line for line in done.stderr.splitlines() if not re.match(r"make(\[\d+\])?: ", line)]
    assert done.returncode != 0
    assert len(ours) == 1 and f"port {port}" in ours[0] and "already in use" in ours[0]
    assert not (tmp_path / "db.sqlite3").exists()


def test_a_websocket_to_a_wrong_path_is_told_the_endpoint_and_closed_1008_without_a_traceback(
    fresh, tmp_path
):
    port = free_port()
    make_run_steps(fresh, tmp_path, port)
    server = start_daphne(fresh, tmp_path, port=port)
    try:
        async def try_wrong_path() -> tuple[str, int]:
            async with websockets.connect(f"ws://127.0.0.1:{port}/owlayer", proxy=None) as socket_:
                first = await asyncio.wait_for(socket_.recv(), EVENT_TIMEOUT)
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(socket_.recv(), EVENT_TIMEOUT)
                return first, closed.value.rcvd.code

        frame, close_code = asyncio.run(try_wrong_path())
    finally:
        server.stop()
    assert '"code":"unknown_endpoint"' in frame and "the endpoint is /owllayer" in frame
    assert close_code == 1008
    assert "Traceback" not in server.logs() and " ERROR " not in server.logs()


def short_explanation(stderr: str, program: str) -> str:
    """The program's own lines (no log lines), which must be a paragraph, not a traceback."""
    lines = [line for line in stderr.splitlines() if " INFO " not in line]
    assert "Traceback" not in stderr
    assert lines and lines[0].startswith(f"{program}: ")
    assert len(lines) <= 3
    return " ".join(lines)


def test_manage_py_without_a_secret_or_debug_says_what_to_set_in_one_paragraph(fresh):
    env = {name: value for name, value in fresh.items() if name != "DJANGO_DEBUG"}

    done = manage(env, "showmigrations")

    said = short_explanation(done.stderr, "manage.py")
    assert done.returncode == 2
    assert "DJANGO_DEBUG=true" in said and "DJANGO_SECRET_KEY" in said


def test_manage_py_with_a_database_that_does_not_answer_names_it_without_its_password(fresh):
    env = {**fresh, "DATABASE_URL": f"postgres://owl:hunter2@127.0.0.1:{free_port()}/owllayer",
           "OWLLAYER_DB_POOL_TIMEOUT": "1"}

    done = manage(env, "migrate", "--noinput")

    said = short_explanation(done.stderr, "manage.py")
    assert done.returncode == 2
    assert "Cannot reach the database at DATABASE_URL=postgres://owl:***@127.0.0.1" in said
    assert "hunter2" not in done.stderr


def test_manage_py_with_a_database_url_it_cannot_parse_says_so(fresh):
    done = manage({**fresh, "DATABASE_URL": "postgres//owl@db/owllayer"}, "migrate")

    said = short_explanation(done.stderr, "manage.py")
    assert "DATABASE_URL is not a usable database URL" in said


def test_the_server_with_a_redis_that_does_not_answer_warns_naming_it_and_serves_anyway(fresh):
    assert manage(fresh, "migrate", "--noinput").returncode == 0
    port = free_port()
    env = {**fresh, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    server = subprocess.Popen(
        [sys.executable, "-m", "owllayer_site.serve", "--bind", "127.0.0.1", "--port", str(port)],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        answered = None
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while answered is None and server.poll() is None and time.monotonic() < deadline:
            try:
                answered = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code
            except httpx.TransportError:
                time.sleep(0.2)
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=COMMAND_TIMEOUT)

    assert answered == 200
    assert "warning: Cannot reach Redis at REDIS_URL=redis://127.0.0.1:" in stderr


def test_the_server_on_a_database_without_tables_says_to_migrate(fresh):
    done = serve_check(fresh, "--port", str(free_port()))

    said = short_explanation(done.stderr, "owllayer_site.serve")
    assert done.returncode == 2
    assert "has no tables yet" in said and "manage.py migrate" in said
