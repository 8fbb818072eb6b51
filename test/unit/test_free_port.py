"""`get_free_port` picks outside the OS's ephemeral range (where outgoing connections take
their source ports) and falls back to `bind(0)` when nothing there is free."""

import socket

from sglang.srt.utils.network import _pick_range, ephemeral_port_range, get_free_port


def test_pick_is_outside_the_ephemeral_range_and_bindable():
    lo, hi = ephemeral_port_range()
    for _ in range(20):
        port = get_free_port()
        assert not lo <= port <= hi
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_range_file_is_read_and_bad_files_give_the_default(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("40000\t50000\n")
    bad.write_text("not a range\n")
    assert ephemeral_port_range(str(good)) == (40000, 50000)
    assert ephemeral_port_range(str(bad)) == (32768, 60999)
    assert ephemeral_port_range(str(tmp_path / "missing")) == (32768, 60999)


def test_the_wider_side_of_the_ephemeral_range_is_used():
    assert _pick_range((32768, 60999)) == (10000, 32767)
    assert _pick_range((10000, 20000)) == (20001, 65535)


def test_a_taken_port_is_never_returned():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # the pick range is the taken port alone: the pick falls back to bind(0)
        for _ in range(5):
            port = get_free_port(pick=(taken, taken))
            assert port != taken
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
