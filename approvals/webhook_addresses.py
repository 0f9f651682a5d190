"""Which addresses a tenant's webhook may reach: IANA's registries, as a table.

PURE: no Django, no I/O; ``approvals.webhooks`` supplies the settings.

Python's ``ipaddress`` flags (``is_global``, ``is_private``, ...) follow an
older copy of the registries and miss entries (192.0.0.8/32, 64:ff9b:1::/48,
5f00::/16, 3fff::/20, ...). So the verdict comes from the tables below, one
row per entry of IANA's IPv4 and IPv6 Special-Purpose Address Registries
(RFC 6890), with the registry's "Globally Reachable" column: ``True``,
``False``, or ``None`` where the registry says N/A. The most specific entry
holding an address decides (192.0.0.9/32, reachable, lies inside
192.0.0.0/24, which is not). An address in an entry that is not globally
reachable (``False`` or N/A) is refused; so are multicast and, for IPv6,
everything outside the global unicast space 2000::/3.

An address that stands for an IPv4 address is judged by that IPv4 address:

- IPv4-mapped ``::ffff:a.b.c.d`` and IPv4-compatible ``::a.b.c.d`` (a socket
  connects to a.b.c.d itself);
- 6to4 ``2002:AABB:CCDD::/48`` (a relay delivers to the IPv4 address in bits
  16-47);
- NAT64 through the well-known prefix ``64:ff9b::/96`` (RFC 6052: the last 32
  bits);
- Teredo ``2001:0::/32`` (RFC 4380): both the Teredo server's IPv4 address
  (bits 32-63) and the client's (the last 32 bits, inverted) must be allowed.

The local-use NAT64 prefix ``64:ff9b:1::/48`` (RFC 8215) is not globally
reachable: its translator sits in the operator's own network. It is refused
unless a tool's networks open it, and an opening must be a /96 or longer,
so that the IPv4 address is the last 32 bits; that address must then be
allowed too, so opening a translator never opens every network behind it.

A server tool may be given networks its webhook may reach although not
public (``AllowedNetwork``, parsed by ``parse_networks``); each counts only
where it lies inside the process-wide ceiling the operator sets.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class RegistryEntry:
    network: IPNetwork
    name: str
    globally_reachable: bool | None  # None: the registry says N/A


def _entries(rows: Iterable[tuple[str, str, bool | None]]) -> tuple[RegistryEntry, ...]:
    return tuple(RegistryEntry(ipaddress.ip_network(net), name, reachable)
                 for net, name, reachable in rows)


# IANA IPv4 Special-Purpose Address Registry (iana-ipv4-special-registry).
IPV4_SPECIAL = _entries([
    ("0.0.0.0/8", '"This network"', False),
    ("0.0.0.0/32", '"This host on this network"', False),
    ("10.0.0.0/8", "Private-Use", False),
    ("100.64.0.0/10", "Shared Address Space", False),
    ("127.0.0.0/8", "Loopback", False),
    ("169.254.0.0/16", "Link Local", False),
    ("172.16.0.0/12", "Private-Use", False),
    ("192.0.0.0/24", "IETF Protocol Assignments", False),
    ("192.0.0.0/29", "IPv4 Service Continuity Prefix", False),
    ("192.0.0.8/32", "IPv4 dummy address", False),
    ("192.0.0.9/32", "Port Control Protocol Anycast", True),
    ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", True),
    ("192.0.0.170/32", "NAT64/DNS64 Discovery", False),
    ("192.0.0.171/32", "NAT64/DNS64 Discovery", False),
    ("192.0.2.0/24", "Documentation (TEST-NET-1)", False),
    ("192.31.196.0/24", "AS112-v4", True),
    ("192.52.193.0/24", "AMT", True),
    ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", None),
    ("192.88.99.2/32", "6a44-relay anycast address", True),
    ("192.168.0.0/16", "Private-Use", False),
    ("192.175.48.0/24", "Direct Delegation AS112 Service", True),
    ("198.18.0.0/15", "Benchmarking", False),
    ("198.51.100.0/24", "Documentation (TEST-NET-2)", False),
    ("203.0.113.0/24", "Documentation (TEST-NET-3)", False),
    ("240.0.0.0/4", "Reserved", False),
    ("255.255.255.255/32", "Limited Broadcast", False),
])

# IANA IPv6 Special-Purpose Address Registry (iana-ipv6-special-registry).
IPV6_SPECIAL = _entries([
    ("::1/128", "Loopback Address", False),
    ("::/128", "Unspecified Address", False),
    ("::ffff:0:0/96", "IPv4-mapped Address", False),
    ("64:ff9b::/96", "IPv4-IPv6 Translat.", True),
    ("64:ff9b:1::/48", "IPv4-IPv6 Translat.", False),
    ("100::/64", "Discard-Only Address Block", False),
    ("100:0:0:1::/64", "Dummy IPv6 Prefix", False),
    ("2001::/23", "IETF Protocol Assignments", False),
    ("2001::/32", "TEREDO", None),
    ("2001:1::1/128", "Port Control Protocol Anycast", True),
    ("2001:1::2/128", "Traversal Using Relays around NAT Anycast", True),
    ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast Address", True),
    ("2001:2::/48", "Benchmarking", False),
    ("2001:3::/32", "AMT", True),
    ("2001:4:112::/48", "AS112-v6", True),
    ("2001:10::/28", "Deprecated (previously ORCHID)", None),
    ("2001:20::/28", "ORCHIDv2", True),
    ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", True),
    ("2001:db8::/32", "Documentation", False),
    ("2002::/16", "6to4", None),
    ("2620:4f:8000::/48", "Direct Delegation AS112 Service", True),
    ("3fff::/20", "Documentation", False),
    ("5f00::/16", "Segment Routing (SRv6) SIDs", False),
    ("fc00::/7", "Unique-Local", False),
    ("fe80::/10", "Link-Local Unicast", False),
])

# Not in those registries, refused all the same: multicast (IANA's multicast
# address space registries), and IPv6 outside the global unicast space
# (IANA's IPv6 Address Space: the rest is reserved by the IETF).
IPV4_MULTICAST = ipaddress.IPv4Network("224.0.0.0/4")
IPV6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")

IPV4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
TEREDO = ipaddress.IPv6Network("2001::/32")
# An opening inside the local-use NAT64 prefix must be at least this long.
NAT64_LOCAL_MIN_PREFIX = 96


def registry_entry(address: IPAddress) -> RegistryEntry | None:
    """The most specific registry entry holding ``address``, if any."""
    table = IPV4_SPECIAL if address.version == 4 else IPV6_SPECIAL
    holding = [entry for entry in table if address in entry.network]
    return max(holding, key=lambda entry: entry.network.prefixlen, default=None)


def is_public(address: IPAddress) -> bool:
    """Globally reachable by the registries, judged on this address alone."""
    entry = registry_entry(address)
    if entry is not None:
        return entry.globally_reachable is True
    if address.version == 4:
        return address not in IPV4_MULTICAST
    return address in IPV6_GLOBAL_UNICAST


def embedded_ipv4(address: IPAddress) -> tuple[ipaddress.IPv4Address, ...] | None:
    """The IPv4 addresses a connection to ``address`` ends at, where it stands
    for IPv4 (see the module docstring); None otherwise. The local-use NAT64
    prefix is not here: it is judged by its own rule."""
    if address.version == 4:
        return None
    assert isinstance(address, ipaddress.IPv6Address)
    if address in IPV4_MAPPED:
        return (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF),)
    if address in IPV4_COMPATIBLE and int(address) > 1:  # :: and ::1 have rows of their own
        return (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF),)
    if address in NAT64_WELL_KNOWN:
        return (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF),)
    if address in SIX_TO_FOUR:
        return (ipaddress.IPv4Address((int(address) >> 80) & 0xFFFFFFFF),)
    if address in TEREDO:
        server, client = address.teredo  # type: ignore[misc]  # never None inside 2001::/32
        return (server, client)
    return None


@dataclass(frozen=True)
class AllowedNetwork:
    """A network a tool's webhook may reach although not public; ``ports``
    None means every port."""

    network: IPNetwork
    ports: frozenset[int] | None = None

    def admits(self, address: IPAddress, port: int) -> bool:
        return (address.version == self.network.version and address in self.network
                and (self.ports is None or port in self.ports))

    def __str__(self) -> str:
        if self.ports is None:
            return str(self.network)
        ports = ",".join(str(p) for p in sorted(self.ports))
        net = f"[{self.network}]" if self.network.version == 6 else str(self.network)
        return f"{net}:{ports}"


def parse_networks(text: str) -> tuple[AllowedNetwork, ...]:
    """A tool's networks: entries separated by spaces or new lines, each a
    network (``10.20.0.0/16``, ``10.20.0.7``, ``fd00:1::/64``), optionally
    followed by ``:`` and one port or a comma-separated list of ports; an IPv6
    network with ports is written in brackets (``[fd00:1::/64]:8443,9443``).
    ValueError names the first entry that is not one."""
    return tuple(_parse_entry(item) for item in text.split())


def _parse_entry(item: str) -> AllowedNetwork:
    if item.startswith("["):
        net_text, bracket, rest = item[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"{item!r}: write an IPv6 network with ports as [fd00::/64]:443")
        ports_text = rest[1:] if rest else None
    elif item.count(":") == 1:
        net_text, _, ports_text = item.partition(":")
    else:
        net_text, ports_text = item, None
    try:
        network = ipaddress.ip_network(net_text, strict=True)
    except ValueError as exc:
        raise ValueError(f"{item!r}: not a network ({exc})") from None
    if (network.version == 6 and network.subnet_of(NAT64_LOCAL_USE)  # type: ignore[arg-type]
            and network.prefixlen < NAT64_LOCAL_MIN_PREFIX):
        raise ValueError(f"{item!r}: inside 64:ff9b:1::/48 open a /96 or longer")
    if ports_text is None:
        return AllowedNetwork(network)
    ports = set()
    for part in ports_text.split(","):
        if not part.isdigit() or not 0 < int(part) < 65536:
            raise ValueError(f"{item!r}: {part!r} is not a port (1-65535)")
        ports.add(int(part))
    return AllowedNetwork(network, frozenset(ports))


def within(entry: AllowedNetwork, ceiling: Sequence[IPNetwork]) -> bool:
    """Whether the whole of ``entry`` lies inside one network of ``ceiling``."""
    return any(entry.network.version == net.version
               and entry.network.subnet_of(net)  # type: ignore[arg-type]
               for net in ceiling)


def address_allowed(address: IPAddress, *, port: int, networks: Sequence[AllowedNetwork] = (),
                    ceiling: Sequence[IPNetwork] = ()) -> bool:
    """Whether a webhook may connect to ``address``:``port``: a public address,
    or one a tool's ``networks`` open (on that port) inside the ``ceiling``."""
    embedded = embedded_ipv4(address)
    if embedded is not None:
        return all(address_allowed(v4, port=port, networks=networks, ceiling=ceiling)
                   for v4 in embedded)
    opened = any(entry.admits(address, port) for entry in networks) and any(
        address.version == net.version and address in net for net in ceiling)
    if address.version == 6 and address in NAT64_LOCAL_USE:
        last32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        return opened and address_allowed(last32, port=port, networks=networks, ceiling=ceiling)
    return opened or is_public(address)
