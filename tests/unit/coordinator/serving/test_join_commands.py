"""The coordinator says how to join its run, with a URL other machines can dial."""

from __future__ import annotations

import socket

from coordinator.serving.server import join_commands, reachable_url


def test_a_wildcard_bind_is_named_by_this_machine_or_the_public_host() -> None:
    assert reachable_url("0.0.0.0", 8000, None) == f"http://{socket.getfqdn()}:8000"
    assert reachable_url("0.0.0.0", 8000, "coord.example.org") == "http://coord.example.org:8000"
    assert reachable_url("127.0.0.1", 8123, None) == "http://127.0.0.1:8123"
    assert reachable_url("::", 8000, "2001:db8::1") == "http://[2001:db8::1]:8000"


def test_the_join_commands_name_the_url_and_the_id_to_pin() -> None:
    lines = join_commands("http://coord:8000", "12D3KooWexample")
    assert "prime-worker join --coordinator http://coord:8000 --gpu all" in "\n".join(lines)
    assert "prime-relay serve --upstream http://coord:8000/shardcast --coordinator-id 12D3KooWexample" in "\n".join(
        lines
    )
    assert not any("0.0.0.0" in line for line in lines)
