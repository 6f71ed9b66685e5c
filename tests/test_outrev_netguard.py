"""The outbound guard's address table: IPv6 ranges that Python's own tables take for public."""

from __future__ import annotations

import ipaddress

import pytest

from approvals import netguard


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        # A local-use NAT64 prefix (RFC 8215) with a /48 translator: 10.0.0.7 inside, 8.8.8.8 at the end.
        ("64:ff9b:1:a00:7:0:808:808", "a local-use NAT64 address"),
        ("64:ff9b:1::808:808", "a local-use NAT64 address"),
        ("3fff::1", "a documentation address"),
    ],
)
def test_outrev_ipv6_ranges_that_are_not_public_are_refused(address: str, problem: str) -> None:
    assert netguard.address_problem(ipaddress.ip_address(address)) == problem
    with pytest.raises(netguard.Refused) as refused:
        netguard.check_url(f"https://[{address}]/hook", allow=netguard.Allow())
    assert problem in refused.value.message and not refused.value.transient


def test_outrev_a_name_answering_a_local_use_nat64_address_is_refused() -> None:
    with pytest.raises(netguard.Refused, match="local-use NAT64"):
        netguard.check_url(
            "https://hooks.example.com/x",
            allow=netguard.Allow(),
            resolve=lambda host, port: ["93.184.215.14", "64:ff9b:1:a00:7:0:808:808"],
        )


def test_outrev_the_well_known_nat64_prefix_is_judged_by_the_ipv4_inside() -> None:
    assert netguard.address_problem(ipaddress.ip_address("64:ff9b::808:808")) is None
    assert netguard.address_problem(ipaddress.ip_address("64:ff9b::a00:7")) == "a private address"


def test_outrev_the_allowlist_can_name_a_local_use_nat64_network() -> None:
    allow = netguard.Allow.parse("64:ff9b:1::/48")
    checked = netguard.check_url("https://[64:ff9b:1:a00:7:0:808:808]/hook", allow=allow)
    assert checked.addresses == ("64:ff9b:1:a00:7:0:808:808",)
