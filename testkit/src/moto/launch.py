# Starts moto's server with one change: IPv4 addresses it picks at random in
# a subnet are unique and never one EC2 reserves.
#
# EC2 never hands out an address twice in a VPC, and never the first four or
# the last address of a subnet. moto 5 draws from the whole CIDR with no look
# at what is in use, so a test could see a pod's address also be another
# ENI's primary address, or the subnet's router. Tests of enim must check
# enim, not that emulator quirk.
#
# Usage: python3 launch.py <moto.server arguments>
import ipaddress
import random
import sys
import time

import moto.ec2.models.elastic_network_interfaces as enis_module
import moto.ec2.utils as ec2_utils
from moto.ec2.models import ec2_backends

moto_random_private_ip = ec2_utils.random_private_ip

# Addresses handed out in the last few seconds, by when. An ENI being made
# is not in its backend yet, so without these its secondary addresses could
# repeat its own primary (moto then keeps one: a create asked for 2
# secondaries and got 1).
HANDED_OUT_FOR = 5.0
handed_out = {}


def addresses_in_use():
    used = set()
    for regions in ec2_backends.values():
        for backend in regions.values():
            for eni in backend.enis.values():
                if eni.private_ip_address:
                    used.add(eni.private_ip_address)
                for item in eni.private_ip_addresses:
                    used.add(item.get("PrivateIpAddress"))
            for zone in backend.subnets.values():
                for subnet in zone.values():
                    used.update(subnet._subnet_ips)
    return used


def unique_private_ip(cidr=None, ipv6=False):
    if not cidr or ipv6:
        return moto_random_private_ip(cidr, ipv6)
    net = ipaddress.IPv4Network(cidr, strict=False)
    if net.num_addresses < 8:
        return moto_random_private_ip(cidr, ipv6)
    now = time.monotonic()
    for ip, at in list(handed_out.items()):
        if now - at > HANDED_OUT_FOR:
            del handed_out[ip]
    used = addresses_in_use() | handed_out.keys()
    # EC2 reserves the network address, the next three and the broadcast.
    first, last = int(net.network_address) + 4, int(net.broadcast_address) - 1
    for _ in range(4 * net.num_addresses):
        ip = str(ipaddress.IPv4Address(random.randint(first, last)))
        if ip not in used:
            handed_out[ip] = now
            return ip
    raise RuntimeError(f"no free address left in {cidr}")


ec2_utils.random_private_ip = unique_private_ip
enis_module.random_private_ip = unique_private_ip

# STS's AssumeRoleWithWebIdentity is unsigned at AWS: the web identity
# token is its proof (IRSA). moto 5.2, with its signature checks on, looks
# for an Authorization header on every request and fails this one with a
# 500. Such a request skips the signature check here, as at AWS; every
# other request is checked as before.
from moto.core.authorization import ActionAuthenticatorMixin  # noqa: E402

UNSIGNED_STS = {"AssumeRoleWithWebIdentity"}
moto_authorize = ActionAuthenticatorMixin._authenticate_and_authorize_action


def authorize_unless_unsigned_sts(self, iam_request_cls, resource="*"):
    if "Authorization" not in self.headers and self._get_action() in UNSIGNED_STS:
        return
    return moto_authorize(self, iam_request_cls, resource)


ActionAuthenticatorMixin._authenticate_and_authorize_action = authorize_unless_unsigned_sts

from moto.server import main  # noqa: E402

main(sys.argv[1:])
