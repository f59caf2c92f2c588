"""The ``s3ckpt.tools`` face holds what users call: the report's functions and model (also in
``s3ckpt.tools._report``), not its price helpers or the tools' argument parsers (an inspect
result is ``InspectResult``, one name per concept: ``s3ckpt.retention.CheckpointInfo`` is a
catalog record)."""

from __future__ import annotations

import pytest

import s3ckpt.tools
import s3ckpt.tools._report

REPORT_NAMES = ("collect_report", "build_report", "render_html")
MOVED = {
    "GIB": s3ckpt.tools._report,
    "format_usd": s3ckpt.tools._report,
    "parse_price": s3ckpt.tools._report,
    "DEFAULT_PRICES": s3ckpt.tools._report,
}
INTERNAL = ("NameFilter", "parse_size", "parse_dtype")


def test_the_report_is_reachable_from_the_face_and_its_package() -> None:
    for name in REPORT_NAMES:
        assert name in s3ckpt.tools.__all__ and name in s3ckpt.tools._report.__all__
        assert getattr(s3ckpt.tools, name) is getattr(s3ckpt.tools._report, name)


def test_the_face_holds_no_report_internals_or_parsers() -> None:
    for name in (*MOVED, *INTERNAL, "CheckpointInfo"):
        assert name not in s3ckpt.tools.__all__, name
        assert name not in dir(s3ckpt.tools), name


def test_the_moved_names_are_gone_from_the_face() -> None:
    for name in (*MOVED, *INTERNAL, "CheckpointInfo"):
        with pytest.raises(AttributeError):
            getattr(s3ckpt.tools, name)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = s3ckpt.tools.nope  # type: ignore[attr-defined]
