"""What each new WebSocket connection costs the process under daphne
(owllayer_site.daphne_close)."""
from __future__ import annotations

import pprint

from autobahn.websocket import protocol

from owllayer_site import daphne_close


def test_a_connections_configuration_is_pretty_printed_only_when_its_debug_line_is_written(
        monkeypatch):
    daphne_close.install()
    printed: list = []
    monkeypatch.setattr(pprint, "pformat", lambda value: printed.append(value) or "printed")
    attrs = protocol.pformat([("openHandshakeTimeout", 5)])
    assert printed == []
    assert f"\n{attrs}" == "\nprinted"
    assert printed == [[("openHandshakeTimeout", 5)]]


def test_connection_timings_still_read_as_text():
    daphne_close.install()
    timings = protocol.Timings()
    timings.track("onOpen")
    assert str(timings).startswith("{'onOpen': ")



def test_the_highlighted_names_and_values_of_debug_lines_are_made_only_when_a_line_is_written(
        monkeypatch):
    from autobahn import util
    from autobahn.twisted import websocket

    daphne_close.install()
    made: list = []
    monkeypatch.setattr(util, "hlval", lambda value: made.append(value) or "made")
    for module in (protocol, websocket):
        value = module.hlval(1234)
        assert made == []
        assert f"peer={value}" == "peer=made"
        assert made == [1234]
        made.clear()


def test_a_highlighted_name_reads_as_autobahns_own():
    from autobahn import util

    daphne_close.install()
    name = test_a_highlighted_name_reads_as_autobahns_own
    assert f"{protocol.hltype(name)}" == util.hltype(name)


def test_a_closed_websocket_protocol_is_no_longer_kept_by_its_fired_is_closed():
    import txaio
    from daphne.ws_protocol import WebSocketProtocol

    txaio.use_twisted()
    daphne_close.install()
    connection = WebSocketProtocol()
    txaio.resolve(connection.is_closed, connection)  # as autobahn does once closed
    daphne_close.forget_closed_protocol(connection)
    assert connection.is_closed.called and connection.is_closed.result is None
    assert WebSocketProtocol.connectionLost.__module__ == daphne_close.__name__


def test_the_request_a_websocket_was_upgraded_from_leaves_its_channels_queue():
    from types import SimpleNamespace

    from daphne.http_protocol import WebRequest
    from twisted.internet.testing import StringTransport
    from twisted.web.http import HTTPChannel

    daphne_close.install()
    channel = HTTPChannel()
    channel.transport = StringTransport()
    channel.factory = SimpleNamespace(server=SimpleNamespace(protocol_connected=lambda p: None))
    request = WebRequest(channel)
    later = WebRequest(channel)
    channel.requests.extend([request, later])
    daphne_close.release_upgraded_request(request)
    assert channel.requests == [later]
    assert WebRequest.process.__module__ == daphne_close.__name__
