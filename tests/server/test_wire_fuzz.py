"""Garbage on the wire stays inside its connection: a bounded run of scripts/fuzz_wire.py (seeded mutations of
HTTP/1.1 and HTTP/2 byte streams, each on a fresh loopback connection) against a real `pyserve serve`, while an
honest client streams the same temperature-0 completion over HTTP/1.1 and h2c in turn.

Asserted: the server never exits and answers /health 200 after every batch of 8; no input is answered with a
5xx (but 501, see fuzz_wire.server_error); every honest stream repeats the non-streamed answer; SIGTERM at the
end exits 0 with no traceback but those of contained connection errors. First, the inputs that ended the whole
server on Hypercorn 0.18 before connection errors were contained (fuzz_wire.known_cases), one test each.

Budget: FUZZ_INPUTS inputs or FUZZ_SECONDS s, whichever comes first (the sequence follows from SEED alone;
PYSERVE_WIRE_FUZZ_SECONDS / _INPUTS change the budget). The long run by hand: scripts/fuzz_wire.py --seconds 600.
"""
from __future__ import annotations

import os
import time

import pytest

from support.wire_servers import fuzz_wire, shared_server, srv  # noqa: F401 - fixtures

SEED = 20261201
FUZZ_SECONDS = float(os.environ.get("PYSERVE_WIRE_FUZZ_SECONDS", "30"))
FUZZ_INPUTS = int(os.environ.get("PYSERVE_WIRE_FUZZ_INPUTS", "300"))


shared = shared_server()


async def exited(srv, suspects: list) -> str:
    """What a failure says when the server exited or stopped answering after `suspects`."""
    return "after one of:\n" + "\n".join(map(str, suspects)) + "\n" + await fuzz_wire.exit_note(srv)


@pytest.mark.parametrize("case", fuzz_wire.known_cases(), ids=lambda c: c.ops[0].split(":")[1])
async def test_an_input_that_used_to_end_the_server(srv, case):
    tally = fuzz_wire.Tally()
    suspects = await fuzz_wire.session(srv, iter([case]), time.monotonic() + 30, 1, tally, batch=1)
    assert not suspects, await exited(srv, suspects)
    assert tally.total == 1 and not tally.fivexx, tally.fivexx_cases
    assert tally.honest_intact >= 1 and not tally.honest_wrong, tally.honest_wrong


async def test_mutation_fuzz_short_run(srv):
    tally = fuzz_wire.Tally()
    suspects = await fuzz_wire.session(srv, fuzz_wire.generate(SEED), time.monotonic() + FUZZ_SECONDS,
                                       FUZZ_INPUTS, tally, batch=8)
    print("\n".join(fuzz_wire.report(tally, FUZZ_SECONDS)))
    assert not suspects, await exited(srv, suspects)
    assert tally.tried["h1"] >= 40 and tally.tried["h2"] >= 40, tally.tried  # the budget went to fuzzing
    assert not tally.fivexx, "\n".join(f"{codes}: {case}" for case, codes in tally.fivexx_cases)
    assert tally.honest_intact >= 1 and not tally.honest_wrong, tally.honest_wrong
