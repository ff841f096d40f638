#!/usr/bin/env python3
"""An independent reader of TensorBoard event files (python3's standard library only: no
tensorboard, no tensorflow, no protobuf package), for tests/cli/tensorboard.sh.

  tfevents_read.py dump FILE...          every scalar as "step<TAB>tag<TAB>value", files in order
  tfevents_read.py compare DIR METRICS   DIR's event files against a run's metrics.jsonl
  tfevents_read.py selftest              CRC-32C against its check value (and a changed input)

The TFRecord framing (TensorFlow's core/lib/io/record_writer.cc): uint64 length (little-endian),
uint32 masked CRC-32C of those 8 bytes, the data, uint32 masked CRC-32C of the data; masked(c) =
((c >> 15) | (c << 17)) + 0xa282ead8. Both CRCs are checked, and a record cut short is an error.
Each record is a tensorflow.Event (core/util/event.proto), decoded field by field here: wall_time
(1, fixed64 double), step (2, varint), file_version (3, string), summary (5: Summary, whose
repeated value (1) is {tag (1, string), simple_value (2, fixed32 float)}); a field of another
number is skipped by its wire type, an unknown wire type is an error.
"""
import glob
import json
import math
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class Bad(Exception):
    pass


def records(path):
    data = open(path, "rb").read()
    at = 0
    while at < len(data):
        if len(data) - at < 12:
            raise Bad("%s: record at byte %d: header cut short (%d bytes)" % (path, at, len(data) - at))
        n, hcrc = struct.unpack_from("<QI", data, at)
        if masked(crc32c(data[at:at + 8])) != hcrc:
            raise Bad("%s: record at byte %d: length CRC mismatch" % (path, at))
        if len(data) - at - 12 < n + 4:
            raise Bad("%s: record at byte %d: %d data bytes announced, %d there" %
                      (path, at, n, len(data) - at - 16))
        body = data[at + 12:at + 12 + n]
        (dcrc,) = struct.unpack_from("<I", data, at + 12 + n)
        if masked(crc32c(body)) != dcrc:
            raise Bad("%s: record at byte %d: data CRC mismatch" % (path, at))
        yield body
        at += 16 + n


def varint(buf, at):
    v = shift = 0
    while True:
        if at >= len(buf):
            raise Bad("varint cut short")
        b = buf[at]
        at += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, at
        if shift > 63:
            raise Bad("varint longer than 10 bytes")


def fields(buf):
    """(field number, wire type, value) of a protobuf message: an int for varints, bytes for the
    others (8 for fixed64, 4 for fixed32)."""
    at = 0
    while at < len(buf):
        key, at = varint(buf, at)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, at = varint(buf, at)
        elif wire == 1:
            v, at = buf[at:at + 8], at + 8
        elif wire == 2:
            n, at = varint(buf, at)
            v, at = buf[at:at + n], at + n
        elif wire == 5:
            v, at = buf[at:at + 4], at + 4
        else:
            raise Bad("field %d: wire type %d not used by Event" % (num, wire))
        if at > len(buf):
            raise Bad("field %d cut short" % num)
        yield num, wire, v


def event(body):
    ev = {"scalars": {}}
    for num, wire, v in fields(body):
        if num == 1 and wire == 1:
            ev["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2 and wire == 0:
            ev["step"] = v - (1 << 64) if v >= 1 << 63 else v
        elif num == 3 and wire == 2:
            ev["file_version"] = v.decode()
        elif num == 5 and wire == 2:
            for snum, swire, sv in fields(v):
                if snum != 1 or swire != 2:
                    continue
                tag = value = None
                for vnum, vwire, vv in fields(sv):
                    if vnum == 1 and vwire == 2:
                        tag = vv.decode()
                    elif vnum == 2 and vwire == 5:
                        value = struct.unpack("<f", vv)[0]
                if tag is None or value is None:
                    raise Bad("a summary value without a tag or a simple_value")
                ev["scalars"][tag] = value
    return ev


def read_file(path):
    """The file's events; the first must carry file_version brain.Event:2."""
    evs = [event(b) for b in records(path)]
    if not evs or evs[0].get("file_version") != "brain.Event:2":
        raise Bad("%s: the first event has no file_version brain.Event:2" % path)
    for e in evs:
        if "step" not in e or "wall_time" not in e:
            raise Bad("%s: an event without a step or a wall time" % path)
    return evs


def steps_of(dirpath):
    """step -> scalars, over the directory's event files in name order (TensorBoard's): a later
    file's step replaces an earlier one's, as a resumed run's does."""
    files = sorted(glob.glob(os.path.join(dirpath, "events.out.tfevents.*")))
    if not files:
        raise Bad("%s: no event file" % dirpath)
    steps = {}
    for f in files:
        for e in read_file(f)[1:]:
            steps[e["step"]] = e["scalars"]
    return steps, files


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def same(want, got, abs_tol=0.0):
    """got (float32) is want (a JSON number, None for NaN) to float32 precision: one unit in the
    last place, and abs_tol for what the JSON printed with fewer digits; NaN only for NaN."""
    if want is None or (isinstance(want, float) and math.isnan(want)):
        return math.isnan(got)
    if math.isnan(got):
        return False
    w = f32(want) if abs(want) < 3.4e38 else math.copysign(math.inf, want)
    if math.isinf(w) or math.isinf(got):
        return w == got
    return abs(w - got) <= max(abs(w) * 2.0 ** -23, abs_tol)


# metrics.jsonl key -> (tag, absolute tolerance of its printed digits)
MIRRORED = {"loss": ("train/loss", 0), "lr": ("train/lr", 0), "grad_norm": ("train/grad_norm", 0),
            "tokens_per_s": ("perf/tokens_per_s", 0), "mfu": ("perf/mfu", 0),
            "ms": ("perf/step_ms", 0.0005), "val_loss": ("val/loss", 0),
            "loss_scale": ("train/loss_scale", 0), "moe_aux_loss": ("moe/aux_loss", 0),
            "moe_z_loss": ("moe/z_loss", 0), "moe_load_max": ("moe/load_max", 5e-5)}


def compare(dirpath, metrics):
    steps, files = steps_of(dirpath)
    lines = [json.loads(l) for l in open(metrics) if l.strip()]
    lines = [l for l in lines if "step" in l]
    if sorted(steps) != [l["step"] for l in lines]:
        raise Bad("steps differ: events %s, metrics.jsonl %s" %
                  (sorted(steps)[:20], [l["step"] for l in lines][:20]))
    checked = 0
    for l in lines:
        sc = steps[l["step"]]
        want_tags = {MIRRORED[k][0] for k in MIRRORED if k in l} | {"train/skipped"}
        extra = set(sc) - want_tags
        missing = want_tags - set(sc)
        if extra or missing:
            raise Bad("step %d: tags %s missing, %s not in metrics.jsonl" %
                      (l["step"], sorted(missing), sorted(extra)))
        for k, (tag, tol) in MIRRORED.items():
            if k in l and not same(l[k], sc[tag], tol):
                raise Bad("step %d: %s %r in metrics.jsonl, %r in the event file" %
                          (l["step"], tag, l[k], sc[tag]))
            checked += k in l
        if sc["train/skipped"] != (1.0 if l.get("skipped") else 0.0):
            raise Bad("step %d: train/skipped %r, metrics.jsonl skipped %r" %
                      (l["step"], sc["train/skipped"], l.get("skipped")))
        checked += 1
    print("%d steps, %d values equal in %d event file(s)" % (len(lines), checked, len(files)))


def main(argv):
    try:
        if len(argv) >= 3 and argv[1] == "dump":
            for path in argv[2:]:
                for e in read_file(path)[1:]:
                    for tag, v in sorted(e["scalars"].items()):
                        print("%d\t%s\t%.9g" % (e["step"], tag, v))
        elif len(argv) == 4 and argv[1] == "compare":
            compare(argv[2], argv[3])
        elif len(argv) == 2 and argv[1] == "selftest":
            if crc32c(b"123456789") != 0xE3069283 or crc32c(b"123456788") == 0xE3069283:
                raise Bad("CRC-32C of '123456789' is %#x, not 0xe3069283" % crc32c(b"123456789"))
        else:
            sys.stderr.write(__doc__)
            return 2
    except Bad as e:
        sys.stderr.write("tfevents_read: %s\n" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
