"""The nginx configuration and the run's options (pure: nothing is started)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bench import servers
from bench.proxy import render_conf
from bench.run import PHASES, _without_options, parse_args, session_cap


def test_nginx_listens_on_127_0_0_1_only_and_passes_websocket_upgrades(tmp_path: Path):
    conf = render_conf(tmp_path, {"one": 8001, "two": 8002},
                       {"one": [9001], "two": [9001, 9002]})

    listens = [line.strip() for line in conf.splitlines() if line.strip().startswith("listen")]
    assert listens == ["listen 127.0.0.1:8001;", "listen 127.0.0.1:8002;"]
    assert conf.count("proxy_set_header Upgrade $http_upgrade;") == 2
    assert conf.count("proxy_set_header Connection $connection_upgrade;") == 2
    assert "server 127.0.0.1:9001" in conf and "server 127.0.0.1:9002" in conf
    # Everything nginx writes stays in the run's scratch directory.
    for line in conf.splitlines():
        if line.strip().startswith(("pid ", "error_log ", "client_body_temp_path", "proxy_temp_path")):
            assert str(tmp_path) in line


def test_both_backends_pass_every_other_option_to_each_child():
    argv = ["--quick", "--backend", "both", "--json", "out.json", "--strict", "--opens", "7",
            "--backend=both"]

    assert _without_options(argv, {"--backend", "--json"}, {"--strict"}) == [
        "--quick", "--opens", "7"]


def test_the_key_cap_holds_the_largest_line_with_room_to_spare():
    _args, config = parse_args(["--idle-sessions", "5000"])

    assert session_cap(config) > 5000


def test_an_unknown_phase_is_refused_and_the_default_runs_them_all():
    args, _config = parse_args([])
    assert args.only == PHASES
    with pytest.raises(SystemExit):
        parse_args(["--only", "turns,nonsense"])


def test_the_voice_line_runs_on_postgres_only_when_named():
    default, _config = parse_args(["--backend", "postgres"])
    named, _config = parse_args(["--backend", "postgres", "--only", "turns,voice"])

    assert "voice" in PHASES
    assert default.only == tuple(phase for phase in PHASES if phase != "voice")
    assert named.only == ("turns", "voice")


def test_the_full_preset_measures_the_sizes_the_targets_name():
    _args, config = parse_args([])

    assert (config.turn_sessions, config.turn_sessions_large) == (50, 200)
    assert config.open_concurrency == 50
    assert config.idle_sessions == 5000
    assert config.stream_sessions == 50


def test_a_server_the_run_stopped_did_not_die_but_one_that_exited_on_its_own_did(tmp_path):
    sleeper = servers.spawn("sleeper", lambda port: [sys.executable, "-c",
                                                     "import time; time.sleep(60)"],
                            os.environ, tmp_path)
    quitter = servers.spawn("quitter", lambda port: [sys.executable, "-c", "pass"],
                            os.environ, tmp_path)
    try:
        sleeper.stop()
        quitter.process.wait(30)

        assert not sleeper.running and not sleeper.died
        assert quitter.died
    finally:
        sleeper.stop()
        quitter.stop()
