"""``s3ckpt check`` in process on a MemoryStore: the sample, ``--read-data``, the record's
merge, each kind of damage, what is skipped, the marks ``ls`` shows (never stale ones), the
record beside retention (never a checkpoint, never deleted) and the metrics file."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

import pytest

from s3ckpt._crc import crc32c
from s3ckpt._verify import sample_items
from s3ckpt.errors import ConfigError
from s3ckpt.format._manifest import ItemRecord, Manifest, ObjectRecord
from s3ckpt.format._names import (
    CHECK_NAME,
    MANIFEST_NAME,
    METADATA_NAME,
    data_name,
    heartbeat_name,
    items_name,
    metadata_name,
)
from s3ckpt.metrics import CheckMetricsFile
from s3ckpt.metrics._prometheus import CheckValues, last_success
from s3ckpt.retention import KeepLast, RetentionOptions, gc, prune
from s3ckpt.retention._catalog import Life, RunCatalog
from s3ckpt.retention._check_record import CheckEntry, CheckRecord, read_check_record
from s3ckpt.retention._scan import scan
from s3ckpt.store import Location, MemoryStore
from s3ckpt.tools import check
from s3ckpt.tools._check import parse_read_data
from s3ckpt.uri import StoreURL

ROOT = "memory://bkt/runs/"
RUN = StoreURL("memory", "bkt", "runs/a/")


def write(store: MemoryStore, step: int, *, items: int = 4, seed: int = 0) -> Manifest:
    """A committed checkpoint of two data objects of ``items`` items each, with CRC32Cs."""
    tag = uuid.uuid4().hex[:8]
    ckpt = RUN.child(f"step_{step:09d}")
    rng = random.Random(seed + step)
    objects, records = [], []
    for rank in range(2):
        name = data_name(rank, 0, tag)
        body = bytearray()
        for i in range(items):
            b = rng.randbytes(100 + 17 * i)
            records.append(ItemRecord(f"w{rank}.{i}", None, name, len(body), len(b), crc32c(b)))
            body += b
        store.put(ckpt.key(name), bytes(body))
        objects.append(ObjectRecord(name, len(body), rank))
    meta = b"pickled DCP metadata"
    store.put(ckpt.key(metadata_name(tag)), meta)
    m = Manifest(
        save_id=tag + uuid.uuid4().hex[8:],
        created=store.now(),
        world_size=2,
        metadata_key=metadata_name(tag),
        metadata_crc32c=crc32c(meta),
        metadata_size=len(meta),
        objects=tuple(objects),
        items=tuple(records),
        step=step,
    )
    m, records = m.split_items(items_name(tag))
    store.put(ckpt.key(items_name(tag)), records)
    store.put(ckpt.key(MANIFEST_NAME), m.to_json())
    store.put(ckpt.key(METADATA_NAME), meta)
    return m


def check_marks(
    store: MemoryStore, catalogs: list[RunCatalog]
) -> tuple[dict[str, CheckEntry], list[str]]:
    """What the catalog marks damaged by the check record, by URL; the runs' notes."""
    marks = {str(c.url): c.check for cat in catalogs for c in cat.checkpoints if c.check}
    return marks, [cat.check_error for cat in catalogs if cat.check_error]


def key(step: int, name: str) -> str:
    return RUN.child(f"step_{step:09d}").key(name)


def flip(store: MemoryStore, step: int, item: ItemRecord) -> None:
    body = bytearray(store.get(key(step, item.object)))
    body[item.start + item.length // 2] ^= 0x10
    store.put(key(step, item.object), bytes(body))


# -- the sample and --read-data --------------------------------------------------------------
def test_the_sample_is_a_share_of_bytes_drawn_from_the_seed() -> None:
    items = [ItemRecord(f"i{n}", None, "o", n * 1000, 10 if n % 2 else 990, 0) for n in range(100)]
    total = sum(i.length for i in items)
    assert sample_items(items, 0.0, random.Random(1)) == []
    assert sample_items(items, 1.0, random.Random(1)) == items
    one = sample_items(items, 0.05, random.Random(1))
    got = sum(i.length for i in one)
    # at least 5% of the bytes, and no more than one item beyond it
    assert got >= 0.05 * total and got - max(i.length for i in one) < 0.05 * total
    assert one == sorted(one, key=lambda i: i.start)  # the marker's order, for coalescing
    assert sample_items(items, 0.05, random.Random(1)) == one  # the same seed: the same items
    assert sample_items(items, 0.05, random.Random(2)) != one
    assert len(sample_items(items, 1e-9, random.Random(1))) == 1  # at least one item


@pytest.mark.parametrize(
    ("spec", "fraction", "text"),
    [("0", 0.0, "0"), ("5%", 0.05, "5%"), ("0.5%", 0.005, "0.5%"), ("all", 1.0, "all"),
     ("100%", 1.0, "all"), (0.25, 0.25, "25%"), ("0%", 0.0, "0")],
)  # fmt: skip
def test_read_data_spellings(spec: str | float, fraction: float, text: str) -> None:
    assert parse_read_data(spec) == pytest.approx((fraction, text))


@pytest.mark.parametrize("spec", ["5", "abc", "-1%", "101%", "nan%", "", "1.5"])
def test_bad_read_data_is_refused(spec: str) -> None:
    with pytest.raises(ConfigError, match="read_data must be"):
        parse_read_data(spec)


# -- the record's merge ----------------------------------------------------------------------
def entry(name: str, *, damaged: bool, etag: str = '"e1"', tag: str = "aaaaaaaa") -> CheckEntry:
    problems = ({"kind": "checksum", "message": f"{name} is bad"},) if damaged else ()
    return CheckEntry(name, "2025-01-01T00:00:00Z", "sha256:x", etag, tag, damaged, problems)


def test_a_pass_drops_damage_an_unfinished_check_keeps_it_a_run_check_forgets_the_gone() -> None:
    rec = CheckRecord("t0").merge(
        [entry("s1", damaged=True), entry("s2", damaged=True), entry("s3", damaged=False)],
        checked_at="t1",
        read_data="all",
    )
    assert set(rec.damaged) == {"s1", "s2"} and set(rec.checkpoints) == {"s1", "s2", "s3"}
    # one checkpoint checked again (s1 passes), s2 not finished: its damage stays
    rec = rec.merge([entry("s1", damaged=False)], checked_at="t2", read_data="5%")
    assert set(rec.damaged) == {"s2"} and rec.checked_at == "t2" and rec.read_data == "5%"
    # a check of the whole run after s2 and s3 were pruned: their entries go
    rec = rec.merge([entry("s1", damaged=False)], checked_at="t3", read_data="0", present=["s1"])
    assert set(rec.damaged) == set() and set(rec.checkpoints) == {"s1"}
    back = CheckRecord.from_json(
        CheckRecord("t").merge([entry("s9", damaged=True)], checked_at="t", read_data="0").to_json()
    )
    assert back is not None and back.damaged["s9"].problems[0]["message"] == "s9 is bad"
    assert "problems" not in json.loads(back.to_json())["checkpoints"][0]  # only in "damaged"


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"[]", b'{"format": "other", "version": 1}',
     b'{"format": "s3ckpt-check", "version": 2, "checked_at": "t"}',
     b'{"format": "s3ckpt-check", "version": 1, "checked_at": "t", "damaged": [{"name": 1}]}',
     b'{"format": "s3ckpt-check", "version": 1, "checked_at": "t", "damaged": [{"name": "a/b", '
     b'"checked_at": "t"}]}',
     b" " * (8 * 1024 * 1024 + 1)],
)  # fmt: skip
def test_anything_but_a_record_reads_as_none(raw: bytes) -> None:
    assert CheckRecord.from_json(raw) is None


# -- checking --------------------------------------------------------------------------------
def test_a_flipped_byte_is_named_recorded_marked_and_dropped_when_repaired() -> None:
    store = MemoryStore("bkt")
    write(store, 1)
    m2 = write(store, 2)
    clean = check(ROOT, store=store, read_data="all", seed=7)
    assert clean.ok and len(clean.checked) == 2 and clean.items_read == 16
    assert read_check_record(store, RUN) is not None and not read_check_record(store, RUN).damaged  # type: ignore[union-attr]

    bad_item = m2.items[5]
    good = store.get(key(2, bad_item.object))
    flip(store, 2, bad_item)
    assert check(ROOT, store=store, seed=7).ok  # --read-data 0 reads no data: not found
    result = check(ROOT, store=store, read_data="all", seed=7)
    assert not result.ok and [c.name for c in result.damaged] == ["step_000000002"]
    (f,) = result.damaged[0].findings
    assert (f.kind, f.object, f.item) == ("checksum", bad_item.object, bad_item.fqn)
    assert f.expected == f"crc32c {bad_item.crc32c:08x}" and f.found != f.expected
    marks, notes = check_marks(store, scan(Location.of(ROOT, store=store)))
    assert list(marks) == [str(RUN.child("step_000000002"))] and notes == []
    assert marks[str(RUN.child("step_000000002"))].problems[0]["kind"] == "checksum"

    store.put(key(2, bad_item.object), good)  # repaired: the next full check passes it
    assert check(ROOT, store=store, read_data="all").ok
    assert check_marks(store, scan(Location.of(ROOT, store=store)))[0] == {}


def test_no_record_leaves_the_bucket_unchanged() -> None:
    store = MemoryStore("bkt")
    flip(store, 1, write(store, 1).items[0])
    before = dict(store.objects)
    result = check(ROOT, store=store, read_data="all", record=False)
    assert len(result.damaged) == 1 and result.records == ()
    assert store.objects == before


def test_a_mark_is_not_shown_once_the_checkpoint_is_saved_again() -> None:
    store = MemoryStore("bkt")
    m = write(store, 1)
    flip(store, 1, m.items[0])
    assert len(check(ROOT, store=store, read_data="all").damaged) == 1
    assert check_marks(store, scan(Location.of(ROOT, store=store)))[0]
    write(store, 1, seed=99)  # re-saved: a new marker (another ETag and tag)
    marks, _ = check_marks(store, scan(Location.of(ROOT, store=store)))
    assert marks == {}
    assert read_check_record(store, RUN).damaged  # type: ignore[union-attr]  # still recorded


def test_structure_is_checked_without_reading_data() -> None:
    store = MemoryStore("bkt")
    m1, m2, m3 = write(store, 1), write(store, 2), write(store, 3)
    store.delete([key(1, m1.objects[1].name)])  # a missing object
    obj = m2.objects[0]
    store.put(key(2, obj.name), store.get(key(2, obj.name))[:-50])  # truncated
    store.put(key(3, METADATA_NAME), b"pickled DCP metadatX")  # same size, other bytes
    result = check(ROOT, store=store)
    assert result.items_read == 0
    kinds = {c.name: [(f.kind, f.object) for f in c.findings] for c in result.damaged}
    assert kinds == {
        "step_000000001": [("missing_object", m1.objects[1].name)],
        "step_000000002": [("object_size", obj.name)],
        "step_000000003": [("stale_metadata", METADATA_NAME)],
    }
    (f,) = result.damaged[1].findings
    assert (f.expected, f.found) == (f"{obj.size} bytes", f"{obj.size - 50} bytes")
    assert "truncated" in f.message
    assert "s3ckpt gc --apply" in result.damaged[2].findings[0].message
    assert m3.metadata_key != METADATA_NAME


def test_a_truncated_object_read_back_and_a_damaged_marker() -> None:
    store = MemoryStore("bkt")
    m1 = write(store, 1)
    write(store, 2)
    obj = m1.objects[0]
    store.put(key(1, obj.name), store.get(key(1, obj.name))[:-1])
    doc = json.loads(store.get(key(2, MANIFEST_NAME)))
    doc["step"] = 3  # and the digest no longer matches
    store.put(key(2, MANIFEST_NAME), json.dumps(doc).encode())
    result = check(ROOT, store=store, read_data="all")
    one, two = result.damaged
    assert one.findings[0].kind == "object_size"
    assert [f.kind for f in two.findings] == ["marker"] and "digest" in two.findings[0].message
    # the last item lies past the truncated end: not read, named by the size finding
    assert one.items_read == 7


def test_uncommitted_foreign_and_overwritten_checkpoints_are_skipped_and_counted() -> None:
    now = [1.7e9]
    store = MemoryStore("bkt", clock=lambda: now[0])
    store.put(key(3, METADATA_NAME), b"stock")  # stock DCP, no marker, two days old
    store.put(key(3, "__0_0.distcp"), b"data")
    now[0] += 2 * 86400
    write(store, 1)
    store.put(key(2, heartbeat_name("bbbbbbbb", 0)), b"{}")  # a save in progress
    store.put(key(2, data_name(0, 0, "bbbbbbbb")), b"x")
    write(store, 4)
    store.put(key(4, heartbeat_name("cccccccc", 0)), b"{}")  # a new save into step 4
    result = check(ROOT, store=store, read_data="all")
    assert [c.name for c in result.checked] == ["step_000000001"] and result.ok
    reasons = {s.name: s.reason for s in result.skipped}
    assert reasons == {
        "step_000000002": "in_progress",
        "step_000000003": "foreign",
        "step_000000004": "being_written",
    }
    assert result.to_dict()["skipped"]["in_progress"] == 1


def test_one_checkpoint_url_updates_only_its_entry() -> None:
    store = MemoryStore("bkt")
    flip(store, 1, write(store, 1).items[0])
    write(store, 2)
    check(ROOT, store=store, read_data="all")
    check(str(RUN.child("step_000000002")), store=store, read_data="all")
    rec = read_check_record(store, RUN)
    assert rec is not None and set(rec.damaged) == {"step_000000001"}
    assert set(rec.checkpoints) == {"step_000000001", "step_000000002"}


# -- the record beside retention -------------------------------------------------------------
def test_retention_never_takes_the_record_for_a_checkpoint_nor_deletes_it() -> None:
    store = MemoryStore("bkt")
    for step in (1, 2, 3):
        write(store, step)
    check(ROOT, store=store)
    (cat,) = scan(Location.of(ROOT, store=store))
    assert [c.name for c in cat.checkpoints] == [f"step_00000000{s}" for s in (1, 2, 3)]
    prune(Location.of(str(RUN), store=store), KeepLast(1), apply=True)
    gc(Location.of(ROOT, store=store), apply=True)
    assert RUN.key(CHECK_NAME) in store.objects
    assert [k for k in store.objects if k.endswith(MANIFEST_NAME)] == [key(3, MANIFEST_NAME)]
    check(ROOT, store=store)  # a check of the whole run forgets the pruned checkpoints
    assert set(read_check_record(store, RUN).checkpoints) == {"step_000000003"}  # type: ignore[union-attr]


def test_a_checkpoint_the_check_found_damaged_is_damaged_for_every_reader_of_the_catalog() -> None:
    """check -> prune keep-last-1: the damaged newest is kept (never deleted by a plan) but
    not counted: the newest good one is kept too, only the older one goes."""
    store = MemoryStore("bkt")
    write(store, 1), write(store, 2)
    flip(store, 3, write(store, 3).items[-1])
    assert not check(ROOT, store=store, read_data="all").ok
    (cat,) = scan(Location.of(ROOT, store=store))
    lives = {c.name: c.life for c in cat.checkpoints}
    assert lives == {"step_000000001": Life.COMMITTED, "step_000000002": Life.COMMITTED,
                     "step_000000003": Life.DAMAGED}  # fmt: skip
    bad = cat.checkpoints[-1]
    assert bad.damaged and bad.error is None and "the data changed" in (bad.damage or "")
    doc = bad.to_dict()
    assert doc["damaged"] is True and doc["life"] == "damaged" and doc["check"]["problems"]
    shallow = scan(Location.of(ROOT, store=store), options=RetentionOptions(scan="shallow"))
    shallow = shallow[0].checkpoints[-1]
    assert shallow.shallow and shallow.life is Life.DAMAGED  # the shallow scan reads it too
    result = prune(Location.of(str(RUN), store=store), KeepLast(1), apply=True)
    actions = {d.checkpoint.name: d.action for d in result.plan.decisions}
    assert actions == {"step_000000001": "delete", "step_000000002": "keep",
                       "step_000000003": "skip"}  # fmt: skip
    assert [k for k in store.objects if k.endswith(MANIFEST_NAME)] == [
        key(2, MANIFEST_NAME),
        key(3, MANIFEST_NAME),
    ]


# -- metrics ---------------------------------------------------------------------------------
def test_the_metrics_file_keeps_the_last_clean_check(tmp_path: Path) -> None:
    path = str(tmp_path / "check.prom")
    values = CheckValues(
        checked=3, damaged=0, skipped={"archived": 1, "in_progress": 0}, bytes_read=4096,
        items_read=12, read_fraction=0.05,
    )  # fmt: skip
    CheckMetricsFile(path).write(values, success=True)
    text = Path(path).read_text()
    for line in (
        "s3ckpt_check_success 1.0",
        "s3ckpt_check_checked_checkpoints 3.0",
        "s3ckpt_check_damaged_checkpoints 0.0",
        "s3ckpt_check_read_bytes 4096.0",
        "s3ckpt_check_read_fraction 0.05",
        's3ckpt_check_skipped_checkpoints{reason="archived"} 1.0',
    ):
        assert line in text.splitlines(), text
    first = last_success(path)
    assert first is not None
    CheckMetricsFile(path).write(CheckValues(checked=3, damaged=1), success=False)
    text = Path(path).read_text()
    assert "s3ckpt_check_success 0.0" in text and "s3ckpt_check_damaged_checkpoints 1.0" in text
    assert last_success(path) == first  # carried over from the clean check
    (tmp_path / "new.prom").write_text("")
    CheckMetricsFile(str(tmp_path / "new.prom")).write(CheckValues(), success=False)
    assert "last_success" not in (tmp_path / "new.prom").read_text()  # never clean: absent
