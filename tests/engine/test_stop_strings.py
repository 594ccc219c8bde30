"""Stop strings on text pieces: never emit what a match would retract; flush when no match comes."""
from pyserve.engine.stop_strings import StopStrings


def feed_all(stops, pieces):
    s = StopStrings(stops)
    out = [s.feed(p) for p in pieces]
    return out, s


def test_match_straddling_pieces():
    out, s = feed_all(["STOP"], ["hello S", "T", "O", "P and more"])
    assert "".join(out) == "hello " and s.matched == "STOP"
    assert out == ["hello ", "", "", ""]


def test_false_start_is_released():
    out, s = feed_all(["STOP"], ["a ST", "x"])
    assert out == ["a ", "STx"] and s.matched is None


def test_flush_releases_held_tail():
    out, s = feed_all(["<end>"], ["text <e", "n"])
    assert "".join(out) == "text " and s.flush() == "<en"


def test_earliest_of_several():
    out, s = feed_all(["bb", "ab"], ["xaab"])
    assert out == ["xa"] and s.matched == "ab"


def test_unicode():
    out, s = feed_all(["。"], ["你好", "世界。再见"])
    assert "".join(out) == "你好世界" and s.matched == "。"


def test_no_stops_passthrough():
    out, s = feed_all([], ["a", "b"])
    assert out == ["a", "b"] and s.flush() == ""
