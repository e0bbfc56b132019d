#!/usr/bin/python3
"""Link checks for the emulated cluster (standard library only): UDP round-trip time and TCP
throughput between two hosts.

  netcheck.py echo --port P                 # UDP echo server (runs until killed)
  netcheck.py ping HOST --port P [--count 20]
  netcheck.py sink --port P                 # TCP sink: one connection, acknowledges the byte count
  netcheck.py send HOST --port P [--seconds 2] [--block 1M]

`send` prints one line `tcp_throughput HOST bytes seconds bytes_per_s`; the time runs from
the first byte sent to the sink's acknowledgement that it has read everything, so data still
queued in buffers is counted in full. `ping` prints `udp_rtt HOST median_us min_us max_us`.
"""
import argparse
import socket
import statistics
import struct
import sys
import time


def echo(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    while True:
        data, addr = s.recvfrom(2048)
        s.sendto(data, addr)


def ping(host, port, count):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    rtts = []
    for i in range(count + 3):
        t0 = time.perf_counter()
        s.sendto(struct.pack("!I", i), (host, port))
        try:
            while True:  # discard late answers to earlier probes
                data, _ = s.recvfrom(2048)
                if struct.unpack("!I", data[:4])[0] == i:
                    break
        except socket.timeout:
            print(f"udp_rtt {host}: probe {i} got no answer within 1 s", file=sys.stderr)
            sys.exit(1)
        if i >= 3:  # the first probes pay for ARP and cold caches
            rtts.append((time.perf_counter() - t0) * 1e6)
        time.sleep(0.01)
    print(f"udp_rtt {host} {statistics.median(rtts):.1f} {min(rtts):.1f} {max(rtts):.1f}")


def sink(port):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    c, _ = ls.accept()
    buf = bytearray(1 << 20)
    total = 0
    while True:
        n = c.recv_into(buf)
        if n == 0:
            break
        total += n
    c.sendall(struct.pack("!Q", total))
    c.close()


def send(host, port, seconds, block):
    deadline = time.time() + 10
    while True:  # the sink may still be starting
        try:
            c = socket.create_connection((host, port), timeout=2)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    c.settimeout(None)
    data = b"\0" * block
    sent = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        c.sendall(data)
        sent += block
    c.shutdown(socket.SHUT_WR)
    got = b""
    while len(got) < 8:
        more = c.recv(8 - len(got))
        if not more:
            break
        got += more
    dt = time.perf_counter() - t0
    if len(got) != 8 or struct.unpack("!Q", got)[0] != sent:
        print(f"tcp_throughput {host}: the sink did not acknowledge {sent} bytes", file=sys.stderr)
        sys.exit(1)
    print(f"tcp_throughput {host} {sent} {dt:.4f} {sent / dt:.0f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["echo", "ping", "sink", "send"])
    p.add_argument("host", nargs="?")
    p.add_argument("--port", type=int, default=5201)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--block", type=int, default=1 << 20)
    a = p.parse_args()
    if a.mode in ("ping", "send") and not a.host:
        p.error(f"{a.mode} needs a HOST")
    if a.mode == "echo":
        echo(a.port)
    elif a.mode == "ping":
        ping(a.host, a.port, a.count)
    elif a.mode == "sink":
        sink(a.port)
    else:
        send(a.host, a.port, a.seconds, a.block)


if __name__ == "__main__":
    main()
