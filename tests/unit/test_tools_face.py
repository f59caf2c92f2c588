"""The ``s3ckpt.tools`` face holds what users call: the report's functions and model (also in
``s3ckpt.tools.report``), not its price helpers or the tools' argument parsers; names it held
before resolve for one release with a DeprecationWarning (``CheckpointInfo`` is now
``InspectResult``, one name per concept: ``s3ckpt.retention.CheckpointInfo`` is a catalog
record)."""

from __future__ import annotations

import warnings

import pytest

import s3ckpt.tools
import s3ckpt.tools.report
from s3ckpt import retention

REPORT_NAMES = ("collect_report", "build_report", "render_html", "PriceTable", "Report")
MOVED = {
    "GIB": s3ckpt.tools.report,
    "format_usd": s3ckpt.tools.report,
    "parse_price": s3ckpt.tools.report,
    "DEFAULT_PRICES": s3ckpt.tools.report,
}
INTERNAL = ("NameFilter", "parse_size", "parse_dtype")


def test_the_report_is_reachable_from_the_face_and_its_package() -> None:
    for name in REPORT_NAMES:
        assert name in s3ckpt.tools.__all__ and name in s3ckpt.tools.report.__all__
        assert getattr(s3ckpt.tools, name) is getattr(s3ckpt.tools.report, name)


def test_the_face_holds_no_report_internals_or_parsers() -> None:
    for name in (*MOVED, *INTERNAL, "CheckpointInfo"):
        assert name not in s3ckpt.tools.__all__, name
        assert name not in dir(s3ckpt.tools), name


def test_old_names_warn_and_resolve_for_one_release() -> None:
    pytest.importorskip("torch")
    from s3ckpt.tools import _common, _inspect

    expected = {name: getattr(module, name) for name, module in MOVED.items()}
    expected.update({name: getattr(_common, name) for name in INTERNAL})
    expected["CheckpointInfo"] = _inspect.InspectResult
    for name, value in expected.items():
        with pytest.warns(DeprecationWarning, match=rf"s3ckpt\.tools\.{name} is deprecated"):
            assert getattr(s3ckpt.tools, name) is value
    with pytest.warns(DeprecationWarning, match="InspectResult"):
        from s3ckpt.tools import CheckpointInfo  # noqa: F401
    assert s3ckpt.tools.InspectResult is not retention.CheckpointInfo
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert s3ckpt.tools.InspectResult.__name__ == "InspectResult"  # the new name is quiet


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = s3ckpt.tools.nope  # type: ignore[attr-defined]
