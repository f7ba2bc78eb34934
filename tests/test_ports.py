"""Listener ports are chosen outside the kernel's ephemeral range, so an outbound connection cannot take one
between the choice and the bind (the EADDRINUSE seen in CI), and one process never hands out a port twice."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from control.deploy import ports
from control.deploy.ports import PortWalk, ephemeral_range, free_port, free_udp_port


def test_free_ports_lie_below_the_ephemeral_range_and_are_distinct() -> None:
    low, _ = ephemeral_range()
    taken = [free_port() for _ in range(200)] + [free_udp_port() for _ in range(50)]
    if low - ports.LOWEST_PORT >= ports.MIN_SPAN:
        assert all(ports.LOWEST_PORT <= p < low for p in taken), taken
    assert len(set(taken)) == len(taken)


def test_a_port_in_use_is_skipped() -> None:
    walk = PortWalk(20000, 21000, random.Random(7))
    first = walk.take()
    again = PortWalk(20000, 21000, random.Random(7))
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        expected = first + 1 if first + 1 < 21000 else 20000
        assert again.take() == expected


def test_the_walk_wraps_inside_its_range() -> None:
    walk = PortWalk(20000, 21000, random.Random(1))
    seen = {walk.take(socket.SOCK_DGRAM) for _ in range(1000)}
    assert seen <= set(range(20000, 21000))
    assert len(seen) >= 990  # only ports that something else on this host holds are missing


def test_a_narrow_range_falls_back_to_the_kernel(tmp_path: Path) -> None:
    table = tmp_path / "range"
    table.write_text("10500\t60999\n")
    assert ephemeral_range(table) == (10500, 60999)
    walk = PortWalk.below_ephemeral(table)
    assert walk.span == 500
    assert walk.take() >= 10500  # the kernel's own pick, inside its range


def test_an_unreadable_range_is_linux_default(tmp_path: Path) -> None:
    assert ephemeral_range(tmp_path / "absent") == ports.LINUX_DEFAULT_EPHEMERAL
    (tmp_path / "bad").write_text("x y")
    assert ephemeral_range(tmp_path / "bad") == ports.LINUX_DEFAULT_EPHEMERAL
