"""Storage prices: USD per GB-month by S3 storage class (:class:`PriceTable`), and how the
report writes dollars (:func:`format_usd`).

A cost is bytes times price per storage class, GB = 2^30 bytes as AWS bills; nothing else
(minimum sizes and durations, requests, transfer) is counted. Prices are checked when a
table is made: a class name is upper case, a price a finite number >= 0.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from s3ckpt.errors import ConfigError

__all__ = [
    "DEFAULT_PRICES",
    "GIB",
    "PRICES_SOURCE",
    "PriceTable",
    "format_usd",
    "parse_price",
]

GIB = 2**30
"""Bytes in the "GB" of S3's bills: storage is billed per GB-month with GB = 2^30 bytes."""

DEFAULT_PRICES: Mapping[str, float] = MappingProxyType(
    {
        "STANDARD": 0.023,
        "INTELLIGENT_TIERING": 0.023,
        "STANDARD_IA": 0.0125,
        "ONEZONE_IA": 0.01,
        "GLACIER_IR": 0.004,
        "GLACIER": 0.0036,
        "DEEP_ARCHIVE": 0.00099,
        "REDUCED_REDUNDANCY": 0.024,
        "EXPRESS_ONEZONE": 0.11,
    }
)
"""USD per GB-month (GB = 2^30 bytes) by S3 storage class: AWS's list prices for us-east-1,
first tier (the first 50 TB a month), from the Amazon S3 pricing page as of 2025-06.
``INTELLIGENT_TIERING`` is its frequent-access tier (objects that cool down cost less, and a
monitoring fee per object is not counted); ``GLACIER`` is Glacier Flexible Retrieval.

The estimate is bytes times price: minimum billable sizes and durations (128 KiB and 30 days
for the IA classes, 90 / 180 days for the Glacier ones), the Glacier classes' 40 KiB of
overhead per object, requests and transfer are not counted. Other regions, tiers or
negotiated prices: pass your own (:class:`PriceTable`, ``--prices`` / ``--price``)."""

PRICES_SOURCE = "AWS S3 list prices, us-east-1, first tier, as of 2025-06"
"""Where :data:`DEFAULT_PRICES` come from (shown on the page)."""

_CLASS_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _checked(prices: Mapping[str, object], where: str) -> dict[str, float]:
    """``prices`` with upper-case class names, each price a finite number >= 0."""
    out = {}
    for name, value in prices.items():
        cls = name.strip().upper() if isinstance(name, str) else ""
        if not _CLASS_NAME.match(cls):
            raise ConfigError(
                f"{where}: {name!r} is not a storage class name (e.g. STANDARD, STANDARD_IA, "
                "GLACIER)"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: the price of {cls} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{where}: the price of {cls} must be >= 0, got {value!r}")
        out[cls] = float(value)
    return out


@dataclass(frozen=True)
class PriceTable:
    """Storage prices in USD per GB-month (GB = 2^30 bytes, as AWS bills) by storage class.

    Attributes:
        prices: Storage class -> USD per GB-month. Class names are upper case, as S3
            lists them (``STANDARD``, ``STANDARD_IA``, ``GLACIER_IR``, ...).
        source: Where the prices come from (shown on the page).

    The default is :data:`DEFAULT_PRICES`. ``PriceTable().with_prices({"STANDARD": 0.021})``
    overrides some classes and keeps the rest; :meth:`load` reads a TOML file.
    """

    prices: Mapping[str, float] = field(default_factory=lambda: DEFAULT_PRICES)
    source: str = PRICES_SOURCE

    def __post_init__(self) -> None:
        object.__setattr__(self, "prices", MappingProxyType(_checked(self.prices, "price table")))

    def price(self, storage_class: str, where: str = "") -> float:
        """USD per GB-month of ``storage_class``.

        Raises:
            ConfigError: The table has no price for it; the message names the class and
                how to add one.
        """
        if storage_class not in self.prices:
            raise ConfigError(
                f"no price for storage class {storage_class!r}{f' ({where})' if where else ''}: "
                f"add one with --price {storage_class}=USD_PER_GB_MONTH, or a line "
                f'"{storage_class} = ..." under [prices] in the --prices file '
                f"(known: {', '.join(sorted(self.prices))})"
            )
        return self.prices[storage_class]

    def monthly_cost(self, bytes_by_class: Mapping[str, int], where: str = "") -> float:
        """USD per month for ``bytes_by_class`` (storage class -> bytes)."""
        return sum(n / GIB * self.price(cls, where) for cls, n in bytes_by_class.items() if n)

    def with_prices(self, prices: Mapping[str, float], source: str | None = None) -> PriceTable:
        """This table with ``prices`` added or replaced (other classes keep their price)."""
        merged = {**self.prices, **_checked(prices, "price")}
        return PriceTable(merged, source if source is not None else f"{self.source}, overridden")

    @classmethod
    def load(cls, path: str | Path, base: PriceTable | None = None) -> PriceTable:
        """``base`` (default: :data:`DEFAULT_PRICES`) with the prices of a TOML file.

        The file holds ``CLASS = USD`` lines, under a ``[prices]`` table or at the top
        level, and optionally ``source = "..."``::

            source = "our EDP rates, eu-west-1, 2025"
            [prices]
            STANDARD = 0.021
            GLACIER_IR = 0.0036

        Raises:
            ConfigError: The file cannot be read, is not TOML, or a price is not a number
                >= 0.
        """
        p = Path(path)
        try:
            doc = tomllib.loads(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read the price file: {exc.strerror or exc}") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{p}: not a TOML price file: {exc}") from exc
        if (source := doc.pop("source", None)) is not None and not isinstance(source, str):
            raise ConfigError(f"{p}: source must be a string, got {source!r}")
        table = doc.pop("prices", doc)  # no [prices] table: the top level
        if table is not doc and doc:
            raise ConfigError(
                f"{p}: unexpected keys beside [prices]: {', '.join(sorted(doc))} "
                "(put every CLASS = USD line under [prices])"
            )
        if not isinstance(table, dict):
            raise ConfigError(f"{p}: [prices] must be a table of CLASS = USD_PER_GB_MONTH")
        return (base or cls()).with_prices(_checked(table, str(p)), source or f"{p}")


def parse_price(text: str) -> tuple[str, float]:
    """``"STANDARD_IA=0.0125"`` -> ``("STANDARD_IA", 0.0125)`` (``--price``).

    Raises:
        ConfigError: Not ``CLASS=USD`` with a number >= 0.
    """
    name, sep, value = text.partition("=")
    if not sep:
        raise ConfigError(f"expected CLASS=USD_PER_GB_MONTH (e.g. STANDARD=0.023), got {text!r}")
    try:
        price = float(value)
    except ValueError:
        raise ConfigError(f"--price {text}: {value!r} is not a number") from None
    return next(iter(_checked({name: price}, "--price").items()))


def format_usd(v: float) -> str:
    """``v`` US dollars as the report shows them: ``$1,234.56``, and ``<$0.01`` for a
    positive amount that rounds to zero cents (never a misleading ``$0.00``)."""
    return "<$0.01" if 0 < abs(v) < 0.005 else f"${v:,.2f}"
