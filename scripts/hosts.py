"""Several "hosts" on one machine: network namespaces joined by a bridge, and the faults of
a network between them (``scripts/chaos.py --hosts 3``).

Each host is a network namespace with one address on a private /24 (``10.<a>.<b>.<i>``),
its ``eth0`` one end of a veth pair whose other end is a port of a bridge in the machine's
own namespace; the machine itself is one more host, on ``.254`` (the bridge's address):
the API, the projector, the effect runner and PostgreSQL run there. Nothing is routed
beyond the bridge: traffic stays between the namespaces this module creates.

A process is started on a host under ``prefix(host, role)``: ``ip netns exec`` into the
host's namespace and ``setpriv --regid`` to the role's group ID (``BROKER``, ``PROCESSOR``,
``WORKER``), still as root. The group is how a fault picks its traffic: each namespace's
nftables table ``chaos`` marks every connection a process of a role opens (``ct mark``, set
on the connection's first packet, which carries the process's group) and its ``fault``
chains hold the faults of the moment, matched on those marks:

* ``cut(host, role)``: every connection the role's processes on ``host`` opened is dropped,
  both ways — the processor or worker of that host cut from the brokers, its local broker
  included (a processor reaches the brokers through the connections it opens);
* ``cut(host, role, receive_only=True)``: only what comes back is dropped — the host can
  send but not receive (an asymmetric cut);
* ``isolate_broker(host)``: the connections between that host's broker and the other
  brokers are dropped both ways, at the side that opened each one; clients still reach every
  broker;
* ``heal()``: every fault removed at once.

A dropped packet is dropped silently (no RST): the peer sees a dead link, as in a real
partition, and learns it only from its own timeouts. Needs root (namespaces, nftables;
``nft`` from Debian's ``nftables`` package) and cleans up what it created (``close``).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import subprocess
from dataclasses import dataclass

# the group ID each role's processes run under: what the faults match on
BROKER, PROCESSOR, WORKER = 3911, 3912, 3913
ROLES = {"broker": BROKER, "processor": PROCESSOR, "worker": WORKER}
_MARK = {BROKER: 0x11, PROCESSOR: 0x12, WORKER: 0x13}


def _run(*argv: str, stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False,
                          timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")


def available() -> str | None:
    """Why hosts cannot be made here (None: they can)."""
    for tool in ("ip", "nft", "setpriv"):
        if shutil.which(tool) is None:
            return f"'{tool}' not found (Debian: iproute2, nftables, util-linux)"
    done = subprocess.run(["ip", "netns", "add", "chronolog-probe"], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        return f"cannot create a network namespace (needs root): {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "chronolog-probe"], check=False, capture_output=True)
    return None


@dataclass(frozen=True)
class Host:
    number: int
    namespace: str
    address: str


class Hosts:
    """``count`` hosts in namespaces of their own, and the machine's own namespace on the
    bridge (``machine_address``)."""

    def __init__(self, count: int, tag: str | None = None) -> None:
        self.tag = tag or f"{random.randrange(16 ** 4):04x}"
        self.bridge = f"clbr{self.tag}"
        a, b = 10, random.randrange(200, 250)
        self.subnet = f"{a}.{b}.{random.randrange(256)}"
        self.machine_address = f"{self.subnet}.254"
        self.hosts = [Host(i, f"chronolog-{self.tag}-h{i}", f"{self.subnet}.{i}")
                      for i in range(1, count + 1)]
        self.created: list[str] = []  # namespaces made, for close

    def host(self, number: int) -> Host:
        return self.hosts[number - 1]

    def up(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self.created.append(self.bridge)
        _run("ip", "addr", "add", f"{self.machine_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for h in self.hosts:
            _run("ip", "netns", "add", h.namespace)
            self.created.append(h.namespace)
            veth = f"clv{self.tag}{h.number}"
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                 "netns", h.namespace)
            _run("ip", "link", "set", veth, "master", self.bridge)
            _run("ip", "link", "set", veth, "up")
            inside = ("ip", "netns", "exec", h.namespace)
            _run(*inside, "ip", "addr", "add", f"{h.address}/24", "dev", "eth0")
            _run(*inside, "ip", "link", "set", "eth0", "up")
            _run(*inside, "ip", "link", "set", "lo", "up")
            _run(*inside, "nft", "-f", "-", stdin=_TABLE)

    def prefix(self, number: int, role: str) -> list[str]:
        """The command prefix that starts a process of ``role`` on host ``number``."""
        return ["ip", "netns", "exec", self.host(number).namespace, "setpriv", "--regid",
                str(ROLES[role]), "--clear-groups"]

    def _nft(self, number: int, *rule: str) -> None:
        _run("ip", "netns", "exec", self.host(number).namespace, "nft", *rule)

    def cut(self, number: int, role: str, receive_only: bool = False) -> None:
        mark = hex(_MARK[ROLES[role]])
        self._nft(number, "add", "rule", "inet", "chaos", "fault_in", "ct", "mark", mark,
                  "drop")
        if not receive_only:
            self._nft(number, "add", "rule", "inet", "chaos", "fault_out", "ct", "mark", mark,
                      "drop")

    def isolate_broker(self, number: int) -> None:
        """Broker ``number`` and the others cannot reach each other; clients reach all."""
        mark = hex(_MARK[BROKER])
        others = [h for h in self.hosts if h.number != number]
        peers = "{ " + ", ".join(h.address for h in others) + " }"
        for chain, field in (("fault_out", "daddr"), ("fault_in", "saddr")):
            self._nft(number, "add", "rule", "inet", "chaos", chain, "ct", "mark", mark,
                      "ip", field, peers, "drop")
            for h in others:
                self._nft(h.number, "add", "rule", "inet", "chaos", chain, "ct", "mark",
                          mark, "ip", field, self.host(number).address, "drop")

    def heal(self) -> None:
        for h in self.hosts:
            for chain in ("fault_out", "fault_in"):
                self._nft(h.number, "flush", "chain", "inet", "chaos", chain)

    def close(self) -> None:
        """Remove the namespaces and the bridge (their veth pairs go with them)."""
        for name in reversed(self.created):
            with contextlib.suppress(RuntimeError):
                if name == self.bridge:
                    _run("ip", "link", "del", name)
                else:
                    _run("ip", "netns", "del", name)
        self.created.clear()


# Every connection a role's process opens carries the role's mark from its first packet
# (which the kernel sends with the process's group ID), so the fault chains can drop a
# connection's packets both ways, or only the ones coming back.
_TABLE = f"""
table inet chaos {{
    chain out {{
        type filter hook output priority 0;
        ct state new meta skgid {BROKER} ct mark set {hex(_MARK[BROKER])}
        ct state new meta skgid {PROCESSOR} ct mark set {hex(_MARK[PROCESSOR])}
        ct state new meta skgid {WORKER} ct mark set {hex(_MARK[WORKER])}
        jump fault_out
    }}
    chain in {{
        type filter hook input priority 0;
        jump fault_in
    }}
    chain fault_out {{ }}
    chain fault_in {{ }}
}}
"""
