"""The node's own PostgreSQL server is never an effect destination, however a DSN spells
its address: every loopback form, the unspecified addresses, IPv4-mapped and -compatible
IPv6, ``localhost``, this machine's own names and addresses, a Unix socket directory, no
host at all — and any database name on it. Another port or another machine is allowed."""

from __future__ import annotations

import socket

import pytest

from chronolog.destinations import check_destinations, database_refusal, parse_destinations
from chronolog.settings import ConfigError

NODE = "postgresql://chronolog:secret@127.0.0.1:54329/chronolog"


def own_address() -> str:
    """A non-loopback address of this machine (the one it routes outward from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("192.0.2.1", 9))  # UDP connect sends nothing; it picks the source
        return str(sock.getsockname()[0])


REFUSED = [
    "postgresql://u@127.0.0.1:54329/chronolog",
    "postgresql://u@127.0.0.1:54329/other_database",
    "postgresql://u@localhost:54329/x",
    "postgresql://u@LOCALHOST:54329/x",
    "postgresql://u@localhost.localdomain:54329/x",
    "postgresql://u@127.1:54329/x",
    "postgresql://u@127.0.0.2:54329/x",
    "postgresql://u@127.255.255.254:54329/x",
    "postgresql://u@2130706433:54329/x",
    "postgresql://u@0x7f.1:54329/x",
    "postgresql://u@0177.0.0.1:54329/x",
    "postgresql://u@0.0.0.0:54329/x",
    "postgresql://u@0:54329/x",
    "postgresql://u@[::]:54329/x",
    "postgresql://u@[::1]:54329/x",
    "postgresql://u@[0:0:0:0:0:0:0:1]:54329/x",
    "postgresql://u@[::ffff:127.0.0.1]:54329/x",
    "postgresql://u@[::ffff:0:7f00:1]:54329/x",  # IPv4-translated
    "postgresql://u@[64:ff9b::7f00:1]:54329/x",  # NAT64 of 127.0.0.1
    "postgresql://u@[2002:7f00:1::1]:54329/x",  # 6to4 of 127.0.0.1
    "postgresql://u@[::ffff:7f00:1]:54329/x",
    "postgresql://u@[::127.0.0.1]:54329/x",
    "postgresql://u@[::ffff:0.0.0.0]:54329/x",
    "postgresql://u@/x?host=/postgres&port=54329",
    "postgresql://u@%2Fvar%2Frun%2Fpostgresql:54329/x",
    "postgresql://u@/x?host=/tmp&port=54329",
    "postgresql://u@:54329/x",
    "postgresql:///x?port=54329",
    "postgresql://u@db.example:5432,127.0.0.1:54329/x",
    "postgresql://u@db.example:54329/x?host=localhost",
    "postgresql://u@db.example:54329/x?hostaddr=127.0.0.1",
    "postgresql://u@db.example/x?host=db.example,127.0.0.1&port=5432,54329",
    "postgres://u@127.0.0.1:54329/x",
    f"postgresql://u@{socket.gethostname()}:54329/x",
]
ALLOWED = [
    "postgresql://u@127.0.0.1:54330/x",
    "postgresql://u@localhost/x",  # the default port 5432: another server
    "postgresql://u@/x?host=/postgres",
    "postgresql://u@192.0.2.10:54329/x",  # another machine (TEST-NET-1)
    "postgresql://u@[2001:db8::1]:54329/x",
    "postgresql://u@no-such-host.invalid:54329/x",
]


@pytest.mark.parametrize("dsn", REFUSED)
def test_every_spelling_of_the_node_server_is_refused(dsn: str) -> None:
    why = database_refusal(dsn, NODE)
    assert why is not None, dsn
    assert "node's own database server" in why and "54329" in why


def test_this_machines_own_address_is_refused() -> None:
    assert database_refusal(f"postgresql://u@{own_address()}:54329/x", NODE) is not None


@pytest.mark.parametrize("dsn", ALLOWED)
def test_other_servers_are_allowed(dsn: str) -> None:
    assert database_refusal(dsn, NODE) is None


def test_a_node_on_a_socket_or_without_host_refuses_loopback_too() -> None:
    node = "postgresql://chronolog@/chronolog?host=/data/postgres&port=54329"
    assert database_refusal("postgresql://u@127.0.0.1:54329/x", node) is not None
    assert database_refusal("postgresql://u@127.0.0.1:54330/x", node) is None


def test_a_remote_node_server_is_refused_by_name_and_address() -> None:
    node = "postgresql://chronolog@192.0.2.10:6432/readmodel"
    assert database_refusal("postgresql://u@192.0.2.10:6432/another", node) is not None
    assert database_refusal("postgresql://u@[::ffff:192.0.2.10]:6432/a", node) is not None
    assert database_refusal("postgresql://u@127.0.0.1:6432/a", node) is None
    assert database_refusal("postgresql://u@192.0.2.10:5432/a", node) is None


def test_no_node_database_refuses_nothing() -> None:
    assert database_refusal("postgresql://u@127.0.0.1:5432/x", None) is None


class _Registry:
    def __init__(self, dsn: str) -> None:
        self.dests = {"acme": parse_destinations("acme", {
            "books": {"kind": "postgres", "dsn": dsn, "sql": "SELECT 1"}})}

    def all_destinations(self) -> dict[str, object]:
        return self.dests


@pytest.mark.parametrize("dsn", ["postgresql://u@0.0.0.0:54329/x",
                                 "postgresql://u@127.1:54329/x",
                                 "postgresql://u@[::ffff:127.0.0.1]:54329/x",
                                 "postgresql://u@/other?host=/postgres&port=54329"])
def test_config_load_names_the_destination(dsn: str) -> None:
    with pytest.raises(ConfigError, match=r"invalid tenants\.acme\.destinations\.books: dsn "
                       r"reaches the node's own database server"):
        check_destinations(_Registry(dsn), None, NODE)
