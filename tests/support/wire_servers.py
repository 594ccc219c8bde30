"""What the wire tests share: scripts/fuzz_wire.py (the mutation engine and its live-server helpers), a
module-wide server that is restarted if an input kills it, and a per-test check that it logged no traceback
but the ones pyserve's connection containment writes."""
from __future__ import annotations

import sys

import pytest

from .paths import SCRIPTS

sys.path.insert(0, str(SCRIPTS))
try:
    import fuzz_wire
finally:
    sys.path.pop(0)


def shared_server(*args: str):
    """A module-scoped fixture: one fuzz_wire.SharedServer with these `pyserve serve` flags; at the end of the
    module it must exit 0 with no stray traceback."""
    @pytest.fixture(scope="module")
    def shared():
        s = fuzz_wire.SharedServer(*args)
        yield s
        code, stray = s.close()
        assert code == 0 and not stray, f"exit status {code}\n" + "\n".join(stray) + "".join(s.srv.stderr)[-3000:]
    return shared


@pytest.fixture
def srv(shared):
    """The shared server; after the test, no traceback in what it logged meanwhile but contained ones."""
    s = shared.live()
    start = len(s.stderr)
    yield s
    stray = fuzz_wire.stray_tracebacks(s.stderr[start:])
    assert not stray, "\n".join(stray)
