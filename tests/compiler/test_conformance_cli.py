"""``python -m rpcsrv.client.compiler.conformance`` runs the cases on a board over RPC: one it starts itself
(``rpcsrv serve`` in a child process, stopped afterwards) unless ``--rpc`` names one."""

from __future__ import annotations

import socket

import pytest

from rpcsrv.client.compiler import conformance


def test_cli_runs_on_a_local_board_and_stops_it(capsys):
    assert conformance.main(["--ops", "relu,sub"]) == 0
    out = capsys.readouterr().out
    assert "relu" in out and "total: " in out and "(100.0%)" in out


def test_local_board_is_a_real_server_and_goes_away():
    with conformance.local_board() as (host, port):
        with socket.create_connection((host, port), timeout=10):
            pass
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=2).close()
