"""Property tests of unpacking archives a hostile sandbox sends (the contract in ``parsers.py``)."""

from __future__ import annotations

from hostile_tar import COMPRESSIONS, FORMATS, LINKS, NAMES, SIZES, TYPES, Member, tar_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from parsers import check_unpack_tar

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = (
    st.sampled_from(NAMES)
    | st.text(max_size=12)
    | (st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map("/".join))
)
members = st.builds(
    Member,
    name=names,
    type=st.sampled_from(TYPES),
    data=st.binary(max_size=1100),
    linkname=st.sampled_from(LINKS) | st.text(max_size=8),
    mode=st.integers(0, 0o7777),
    size=st.none() | st.sampled_from(SIZES) | st.integers(0, 4096),
    format=st.sampled_from(FORMATS),
)
archives = st.builds(
    tar_bytes,
    st.lists(members, max_size=6),
    end=st.booleans(),
    cut=st.none() | st.integers(0, 8192),
    compression=st.sampled_from(COMPRESSIONS),
)


@FUZZ
@given(data=archives)
def test_a_hostile_archive_unpacks_inside_its_destination_or_fails_typed(data: bytes) -> None:
    check_unpack_tar(data)


@FUZZ
@given(data=st.binary(max_size=2048))
def test_random_bytes_unpack_inside_the_destination_or_fail_typed(data: bytes) -> None:
    check_unpack_tar(data)
