"""The trim bound of the streams (`searchr1.streams.safe_min_id`), against hand-checked ids."""

from __future__ import annotations

from searchr1.streams import GroupView, format_id, parse_id, safe_min_id


def test_no_group_means_no_trim():
    assert safe_min_id([]) is None


def test_bound_is_next_unread_when_nothing_pending():
    # everything up to 5-2 read and acked: 5-2 may go, 5-3 (not written yet, or unread) may not
    assert safe_min_id([GroupView("g", "5-2", None)]) == "5-3"


def test_bound_is_oldest_pending():
    assert safe_min_id([GroupView("g", "9-0", "3-7")]) == "3-7"


def test_bound_is_the_slowest_group():
    groups = [GroupView("fast", "100-0", None), GroupView("slow", "40-1", None), GroupView("held", "120-0", "60-0")]
    assert safe_min_id(groups) == "40-2"


def test_nothing_read_trims_nothing():
    assert safe_min_id([GroupView("g", "0-0", None)]) == "0-1"


def test_ids_compare_as_numbers_not_strings():
    # "10-0" < "9-0" as strings; as ids 9-0 comes first
    assert safe_min_id([GroupView("a", "10-0", None), GroupView("b", "8-5", "9-0")]) == "8-6"
    assert parse_id("1700000000000-12") == (1700000000000, 12) and format_id((7, 0)) == "7-0"
