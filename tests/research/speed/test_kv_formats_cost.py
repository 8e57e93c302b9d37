"""The key-cache formats' cost benchmark (python -m research.speed.measure kv-formats): the section with and
without the formats, and a plain forward, timed in the same rounds."""
from research.speed.kv_formats import measure_kv_formats
from research.speed.measure import MEASUREMENTS


def test_the_section_with_and_without_formats_is_timed_in_the_same_rounds():
    r = measure_kv_formats(1, preset="debug")
    assert r["rounds"] == 1 and r["section_s"]["with_formats"] > 0 and r["section_s"]["without"] > 0
    assert r["forward_s"] > 0 and r["section_forwards"] == r["section_s"]["with_formats"] / r["forward_s"]
    assert "kv-formats" in MEASUREMENTS
