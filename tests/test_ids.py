"""Slices must equal the JVM's for every string; checked by property and against a real JDK."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from journal import InvalidArgument, entity_type_of, persistence_id_of, slice_for, slice_ranges
from journal.ids import java_string_hash, validate_persistence_id, validate_slice_range, validate_tags


def reference_hash(s: str) -> int:
    """Java's hashCode written the slow, obvious way (independent of the implementation)."""
    units: list[int] = []
    for ch in s:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    h = 0
    for i, u in enumerate(units):
        h += u * 31 ** (len(units) - 1 - i)
    h %= 2**32
    return h - 2**32 if h >= 2**31 else h


def java_slice(h: int) -> int:
    rem = abs(h) % 1024  # Java: h % 1024 keeps the sign of h; Math.abs of that
    return -rem if h < 0 and rem else rem


def test_known_values() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    assert slice_for("polygenelubricants") == 0


@given(st.text())
def test_hash_matches_reference(s: str) -> None:
    assert java_string_hash(s) == reference_hash(s)
    assert slice_for(s) == abs(java_slice(reference_hash(s)))
    assert 0 <= slice_for(s) < 1024


def test_non_ascii_and_astral() -> None:
    for s in ("Ünïcödé|1", "日本語|エンティティ", "emoji|😀🎉", "𝔘𝔫𝔦|x"):
        assert java_string_hash(s) == reference_hash(s)


def test_entity_type_and_ranges() -> None:
    assert entity_type_of("cart|123") == "cart"
    assert entity_type_of("cart|1|2") == "cart"
    assert entity_type_of("plain") == ""
    assert persistence_id_of("cart", "1") == "cart|1"
    with pytest.raises(InvalidArgument):
        persistence_id_of("ca|rt", "1")
    assert slice_ranges(1) == [(0, 1023)]
    assert slice_ranges(4) == [(0, 255), (256, 511), (512, 767), (768, 1023)]
    assert len(slice_ranges(1024)) == 1024
    for bad in (0, 3, 2048, -1):
        with pytest.raises(InvalidArgument):
            slice_ranges(bad)


def test_validation() -> None:
    for bad in ("", "x" * 256, "a\x00b", 5, None):
        with pytest.raises(InvalidArgument):
            validate_persistence_id(bad)
    with pytest.raises(InvalidArgument):
        validate_slice_range(5, 4)
    with pytest.raises(InvalidArgument):
        validate_slice_range(0, 1024)
    with pytest.raises(InvalidArgument):
        validate_tags("single")
    with pytest.raises(InvalidArgument):
        validate_tags([1])
    with pytest.raises(InvalidArgument):
        validate_tags([""])
    assert validate_tags(["a", "b", "a"]) == ("a", "b")


JAVA_SOURCE = """
import java.io.*;
import java.nio.charset.StandardCharsets;
public class Slices {
  public static void main(String[] a) throws Exception {
    BufferedReader r = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    PrintStream out = new PrintStream(System.out, true, "UTF-8");
    String line;
    while ((line = r.readLine()) != null) {
      String s = line.replace("\\\\n", "\\n");
      out.println(s.hashCode() + " " + Math.abs(s.hashCode() % 1024));
    }
  }
}
"""


@pytest.mark.skipif(shutil.which("java") is None, reason="no `java` on PATH: JDK cross-check skipped")
def test_cross_check_with_the_jdk(tmp_path: Path) -> None:
    src = tmp_path / "Slices.java"
    src.write_text(JAVA_SOURCE)
    samples = [f"cart|{i}" for i in range(500)] + [
        "", "polygenelubricants", "Ünïcödé|1", "日本語|エンティティ", "emoji|😀🎉", "𝔘𝔫𝔦|x",
        "a" * 255, "Aa", "BB", "x|\u00e9\u0301", "\uffff|\u10000",
    ]  # fmt: skip
    proc = subprocess.run(
        ["java", "-Dfile.encoding=UTF-8", str(src)],
        input="\n".join(samples) + "\n",
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == len(samples)
    for s, line in zip(samples, lines, strict=True):
        h, sl = (int(x) for x in line.split())
        assert java_string_hash(s) == h, s
        assert slice_for(s) == sl, s


def test_entity_id_of_is_the_part_after_the_first_separator() -> None:
    from journal.ids import entity_id_of

    assert entity_id_of("account|a|b") == "a|b"
    assert entity_id_of("account|") == ""
    assert entity_id_of("no-type") == "no-type"
    assert entity_id_of(persistence_id_of("cart", "7")) == "7"
