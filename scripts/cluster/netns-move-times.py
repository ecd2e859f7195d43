#!/usr/bin/python3
"""The kernel's cost of moving an interface into a namespace, as enimd pays
it for a primary-mode ADD (scripts/cluster/cloud-scenarios.sh):

    netns-move-times.py DEV:NETNS_PATH...

Run in the namespace that holds each DEV. For each pair, one rtnetlink
request moves DEV into NETNS_PATH and renames it eth0 in the same message,
as enimd does, on one netlink socket opened once (as enimd keeps its host
socket); only the request to its ack is timed, so neither fork/exec of
`ip` nor the namespace's making is counted. Prints each move's time in
microseconds, one a line.
"""

import os
import socket
import struct
import sys
import time

RTM_NEWLINK = 16
NLMSG_ERROR = 2
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
IFLA_IFNAME = 3
IFLA_NET_NS_FD = 28


def attr(kind, data):
    body = struct.pack("HH", 4 + len(data), kind) + data
    return body + b"\0" * (-len(body) % 4)


def move(sock, seq, dev, netns_fd):
    index = socket.if_nametoindex(dev)
    payload = struct.pack("BxHiII", socket.AF_UNSPEC, 0, index, 0, 0)
    payload += attr(IFLA_NET_NS_FD, struct.pack("I", netns_fd)) + attr(IFLA_IFNAME, b"eth0\0")
    msg = struct.pack("IHHII", 16 + len(payload), RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, seq, 0) + payload
    t0 = time.perf_counter_ns()
    sock.send(msg)
    reply = sock.recv(65536)
    took = time.perf_counter_ns() - t0
    kind = struct.unpack_from("H", reply, 4)[0]
    err = struct.unpack_from("i", reply, 16)[0] if kind == NLMSG_ERROR else 0
    if err:
        sys.exit(f"netns-move-times.py: moving {dev}: {os.strerror(-err)}")
    return took // 1000


def main():
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    sock.bind((0, 0))
    for seq, pair in enumerate(sys.argv[1:], 1):
        dev, path = pair.split(":", 1)
        fd = os.open(path, os.O_RDONLY)
        try:
            print(move(sock, seq, dev, fd))
        finally:
            os.close(fd)


if __name__ == "__main__":
    main()
